package webhook

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// opaque is a configuration entry for driver with these parameters, scoped to requests.
func opaque(driver, parameters string, requests ...string) resourceapi.DeviceClaimConfiguration {
	return resourceapi.DeviceClaimConfiguration{Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(parameters)}},
	}}
}

func withConfig(s *resourceapi.ResourceClaimSpec, configs ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaimSpec {
	s.Devices.Config = configs
	return s
}

const vgpuConfig = `{"apiVersion":"vgpu.dra.dev/v1alpha1","kind":"VGPUConfig"`

// TestClaimConfigRules: a claim's opaque configuration for vgpu.dra.dev must be a valid
// VGPUConfig (contract §17) for every request of our classes it applies to; the refusal names
// the claim, the request and the field path; other drivers' configuration is not ours to judge.
func TestClaimConfigRules(t *testing.T) {
	gpu := func(cores string) *resourceapi.ResourceClaimSpec {
		return spec([]resourceapi.DeviceRequest{request("gpu", testClass, 1, "1Gi", cores), request("nic", otherClass, 1, "", "")})
	}
	tests := []struct {
		name   string
		spec   *resourceapi.ResourceClaimSpec
		reason string
		msg    []string
	}{
		{name: "negative: best effort with a ceiling", spec: withConfig(gpu("30"), opaque(testClass, vgpuConfig+`,"class":"BestEffort","coresCeiling":100}`))},
		{name: "negative: guaranteed, no ceiling", spec: withConfig(gpu("30"), opaque(testClass, vgpuConfig+`,"class":"Guaranteed"}`, "gpu"))},
		{name: "negative: YAML parameters", spec: withConfig(gpu("30"), opaque(testClass, "apiVersion: vgpu.dra.dev/v1alpha1\nkind: VGPUConfig\nclass: BestEffort\n"))},
		{name: "negative: another driver's configuration", spec: withConfig(gpu("30"), opaque("nic.example.com", `{"anything":1}`))},
		{name: "unknown field", spec: withConfig(gpu("30"), opaque(testClass, vgpuConfig+`,"cores":50}`)), reason: ReasonInvalidConfig,
			msg: []string{`ResourceClaim "ns/c": spec.devices.config[0].opaque.parameters`, `unknown field "cores"`}},
		{name: "another kind", spec: withConfig(gpu("30"), opaque(testClass, `{"apiVersion":"gpu.nvidia.com/v1beta1","kind":"GpuConfig"}`)),
			reason: ReasonInvalidConfig, msg: []string{"spec.devices.config[0].opaque.parameters.apiVersion", "must be vgpu.dra.dev/v1alpha1, kind VGPUConfig"}},
		{name: "unknown class", spec: withConfig(gpu("30"), opaque(testClass, vgpuConfig+`,"class":"Gold"}`)), reason: ReasonInvalidConfig,
			msg: []string{`request "gpu"`, `spec.devices.config[0].opaque.parameters.class: Unsupported value: "Gold"`}},
		{name: "ceiling below the request", spec: withConfig(gpu("50"), opaque("x.example.com", `{}`), opaque(testClass, vgpuConfig+`,"coresCeiling":30}`)),
			reason: ReasonInvalidConfig, msg: []string{`request "gpu"`, "spec.devices.config[1].opaque.parameters.coresCeiling", "must be at least the cores request 50"}},
		{name: "ceiling below a whole-GPU request", spec: withConfig(gpu(""), opaque(testClass, vgpuConfig+`,"coresCeiling":90}`)),
			reason: ReasonInvalidConfig, msg: []string{"must be at least the cores request 100"}},
		{name: "ceiling above 100 on an entry no vGPU request takes", spec: withConfig(gpu("30"), opaque(testClass, vgpuConfig+`,"coresCeiling":150}`, "nic")),
			reason: ReasonInvalidConfig, msg: []string{"coresCeiling: Invalid value: 150: must be at most 100"}},
		{name: "negative: ceiling scoped to another request", spec: withConfig(gpu("50"), opaque(testClass, vgpuConfig+`,"coresCeiling":30}`, "nic"))},
		{name: "subrequest of a compute class, covered by its request's name",
			spec: withConfig(spec([]resourceapi.DeviceRequest{firstAvailable("gpu", subrequest("big", testBestEffortClass, 1, "4Gi"))}),
				opaque(testClass, vgpuConfig+`,"coresCeiling":50}`, "gpu")),
			reason: ReasonInvalidConfig, msg: []string{`request "gpu/big"`, "must be at least the cores request 100"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkViolations(t, claimRules(tt.spec, testSelection, `ResourceClaim "ns/c"`, claimConfigPath), tt.reason, tt.msg)
		})
	}
}

// TestTemplateConfigPath: a template's refusal names the field where the template has it.
func TestTemplateConfigPath(t *testing.T) {
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "ns"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: *withConfig(spec([]resourceapi.DeviceRequest{request("gpu", testClass, 1, "1Gi", "20")}),
			opaque(testClass, vgpuConfig+`,"class":"BestEfort"}`))}}
	resp := admit(t, newTestReviewer(testRules, fakeSpecs{}), PathValidateClaimTemplates, admission{kind: "ResourceClaimTemplate", obj: tmpl})
	if resp.Allowed || resp.Result == nil {
		t.Fatal("admitted")
	}
	for _, want := range []string{`ResourceClaimTemplate "ns/t"`, `spec.spec.devices.config[0].opaque.parameters.class: Unsupported value: "BestEfort"`} {
		if !strings.Contains(resp.Result.Message, want) {
			t.Errorf("message %q lacks %q", resp.Result.Message, want)
		}
	}
}
