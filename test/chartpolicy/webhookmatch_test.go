package chartpolicy

import (
	"context"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"
)

// webhookMatcher compiles the match conditions of the chart's validating webhook named name,
// rendered with set, with the API server's compiler and environment for webhook matchConditions.
func webhookMatcher(t *testing.T, name string, set map[string]any) matchconditions.Matcher {
	t.Helper()
	for _, doc := range renderTemplate(t, "webhook-configurations.yaml", set) {
		var c admissionregistrationv1.ValidatingWebhookConfiguration
		if err := yaml.UnmarshalStrict([]byte(doc), &c); err != nil || c.Kind != "ValidatingWebhookConfiguration" {
			continue
		}
		for _, w := range c.Webhooks {
			if w.Name != name {
				continue
			}
			compiler, err := cel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
			if err != nil {
				t.Fatal(err)
			}
			conds := make([]cel.ExpressionAccessor, len(w.MatchConditions))
			for i := range w.MatchConditions {
				conds[i] = (*matchconditions.MatchCondition)(&w.MatchConditions[i])
			}
			return matchconditions.NewMatcher(compiler.CompileCondition(conds, cel.OptionalVariableDeclarations{HasAuthorizer: true},
				environment.StoredExpressions), w.FailurePolicy, "webhook", "validating", w.Name)
		}
	}
	t.Fatalf("no validating webhook %s", name)
	return nil
}

func matches(t *testing.T, m matchconditions.Matcher, kind, resource string, obj runtime.Object) bool {
	t.Helper()
	gvk := schema.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: kind}
	gvr := schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: resource}
	attrs := admission.NewAttributesRecord(obj, nil, gvk, "ns", "x", gvr, "", admission.Create, nil, false, nil)
	r := m.Match(context.Background(), &admission.VersionedAttributes{Attributes: attrs, VersionedKind: gvk,
		VersionedObject: admission.NewLazyObject(obj)}, nil, nil)
	if r.Error != nil {
		t.Fatalf("match conditions: %v", r.Error)
	}
	return r.Matches
}

// TestWebhookSeesTheComputeClasses: with the compute classes on (the default), the API server
// sends the webhook the claims that ask for guaranteed.vgpu.dra.dev or best-effort.vgpu.dra.dev,
// so their configuration and capacity are checked like the main class's, and never sends it the
// chart's own DeviceClasses; with the value off, only the main class's claims are sent.
func TestWebhookSeesTheComputeClasses(t *testing.T) {
	claim := func(class string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
			ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "ns"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
				{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}}}}}
	}
	deviceClass := func(name string) *resourceapi.DeviceClass {
		return &resourceapi.DeviceClass{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass"},
			ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{
				{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "vgpu.dra.dev"`}}}}}
	}
	for _, tt := range []struct {
		computeClasses bool
		class          string
		want           bool
	}{
		{true, "vgpu.dra.dev", true}, {true, "best-effort.vgpu.dra.dev", true}, {true, "guaranteed.vgpu.dra.dev", true},
		{true, "gpu.nvidia.com", false}, {false, "vgpu.dra.dev", true}, {false, "best-effort.vgpu.dra.dev", false},
	} {
		set := map[string]any{"deviceClass.computeClasses": tt.computeClasses}
		claims := webhookMatcher(t, "resourceclaims.vgpu.dra.dev", set)
		if got := matches(t, claims, "ResourceClaim", "resourceclaims", claim(tt.class)); got != tt.want {
			t.Errorf("computeClasses %v: a claim of %s sent to the webhook: %v, want %v", tt.computeClasses, tt.class, got, tt.want)
		}
		// The DeviceClass rule reviews only classes that are not ours.
		classes := webhookMatcher(t, "deviceclasses.vgpu.dra.dev", set)
		ours := tt.class == "vgpu.dra.dev" || tt.computeClasses && tt.want
		if got := matches(t, classes, "DeviceClass", "deviceclasses", deviceClass(tt.class)); got == ours {
			t.Errorf("computeClasses %v: DeviceClass %s sent to the webhook: %v, want %v", tt.computeClasses, tt.class, got, !ours)
		}
	}
}

// TestWebhookSeesTheMIGClass: claims of mig.vgpu.dra.dev are vGPU claims to the webhook (their
// capacity and configuration checked like a share's), and the chart's MIG class is not reviewed
// as a foreign DeviceClass — with mig.gpus set or not: an upgrade that turns it on creates the
// class while the previous release's webhook still runs (found by TestMIG, refused there).
func TestWebhookSeesTheMIGClass(t *testing.T) {
	claim := &resourceapi.ResourceClaim{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "ns"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "mig.vgpu.dra.dev"}}}}}}
	class := &resourceapi.DeviceClass{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: "mig.vgpu.dra.dev"}}
	for _, gpus := range []any{"all", 0, ""} {
		set := map[string]any{"mig.gpus": gpus}
		if !matches(t, webhookMatcher(t, "resourceclaims.vgpu.dra.dev", set), "ResourceClaim", "resourceclaims", claim) {
			t.Errorf("mig.gpus=%v: a claim of mig.vgpu.dra.dev is not sent to the webhook", gpus)
		}
		if matches(t, webhookMatcher(t, "deviceclasses.vgpu.dra.dev", set), "DeviceClass", "deviceclasses", class) {
			t.Errorf("mig.gpus=%v: DeviceClass mig.vgpu.dra.dev is sent to the webhook as a foreign class", gpus)
		}
	}
}
