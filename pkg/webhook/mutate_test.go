package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// specsForMutation: a vGPU claim, a vGPU template, a claim of another driver, a claim with one
// vGPU request and one of another class, and a firstAvailable claim that may become a vGPU.
var specsForMutation = fakeSpecs{
	claims: map[string]*resourceapi.ResourceClaimSpec{
		"ns/vgpu":  spec([]resourceapi.DeviceRequest{request("gpu", testClass, 1, "1Gi", "10")}),
		"ns/other": spec([]resourceapi.DeviceRequest{request("nic", otherClass, 1, "", "")}),
		"ns/mixed": spec([]resourceapi.DeviceRequest{request("gpu", testClass, 1, "1Gi", "10"), request("nic", otherClass, 1, "", "")}),
		"ns/maybe": spec([]resourceapi.DeviceRequest{firstAvailable("gpu",
			subrequest("big", otherClass, 1, ""), subrequest("share", testClass, 1, "1Gi"))}),
	},
	templates: map[string]*resourceapi.ResourceClaimSpec{
		"ns/tmpl": spec([]resourceapi.DeviceRequest{request("gpu", testClass, 1, "2Gi", "20")}),
	},
}

// TestRequiredPluginsAnnotation: the mutating rule, for every way a container can ask for a
// vGPU and every form an existing annotation can take (contract §12).
func TestRequiredPluginsAnnotation(t *testing.T) {
	const key = "required-plugins.noderesource.dev/container."
	claims := []corev1.PodResourceClaim{
		podClaim("a", "vgpu", false), podClaim("t", "tmpl", true), podClaim("o", "other", false),
		podClaim("m", "mixed", false), podClaim("f", "maybe", false),
	}
	tests := []struct {
		name        string
		pod         *corev1.Pod
		annotations map[string]string
		plugin      string
		want        map[string]string // annotations set; nil: none
	}{
		{name: "claim of our class", pod: pod(claims, container("app", "a")),
			want: map[string]string{key + "app": `["vgpu.dra.dev"]`}},
		{name: "template of our class", pod: pod(claims, container("app", "t")),
			want: map[string]string{key + "app": `["vgpu.dra.dev"]`}},
		{name: "firstAvailable with a subrequest of our class", pod: pod(claims, container("app", "f")),
			want: map[string]string{key + "app": `["vgpu.dra.dev"]`}},
		{name: "extended resource", pod: pod(nil, withExtended(container("app"), 1)),
			want: map[string]string{key + "app": `["vgpu.dra.dev"]`}},
		{name: "only the containers that use one", pod: pod(claims, container("app", "a"), container("side", "o"), container("plain")),
			want: map[string]string{key + "app": `["vgpu.dra.dev"]`}},
		{name: "init container", pod: withInit(pod(claims, container("app")), container("setup", "a")),
			want: map[string]string{key + "setup": `["vgpu.dra.dev"]`}},
		{name: "our request of a mixed claim", pod: pod(claims, container("app", "m/gpu")),
			want: map[string]string{key + "app": `["vgpu.dra.dev"]`}},
		{name: "negative: another driver's claim", pod: pod(claims, container("app", "o"))},
		{name: "negative: the other request of a mixed claim", pod: pod(claims, container("app", "m/nic"))},
		{name: "negative: no claims", pod: pod(nil, container("app"))},
		{name: "negative: NRI off, nothing to require", pod: pod(claims, container("app", "a")), plugin: "-"},
		{name: "kept: container annotation already names the plugin", pod: pod(claims, container("app", "a")),
			annotations: map[string]string{key + "app": `["vgpu.dra.dev"]`}},
		{name: "kept: pod annotation already names the plugin", pod: pod(claims, container("app", "a")),
			annotations: map[string]string{"required-plugins.noderesource.dev/pod": `["x", "vgpu.dra.dev"]`}},
		{name: "extended: container annotation without the plugin", pod: pod(claims, container("app", "a")),
			annotations: map[string]string{key + "app": `["x"]`},
			want:        map[string]string{key + "app": `["x","vgpu.dra.dev"]`}},
		{name: "extended: pod-scoped list, which the container key would hide", pod: pod(claims, container("app", "a")),
			annotations: map[string]string{"required-plugins.noderesource.dev": "- x"},
			want:        map[string]string{key + "app": `["x","vgpu.dra.dev"]`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.pod.Annotations = tt.annotations
			uses, err := podUses(context.Background(), specsForMutation, testSelection, "ns", tt.pod)
			if err != nil {
				t.Fatal(err)
			}
			plugin := testClass
			if tt.plugin == "-" {
				plugin = ""
			}
			got, err := requiredPluginsAnnotations(tt.pod, uses, plugin)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) || (len(tt.want) > 0 && !maps.Equal(got, tt.want)) {
				t.Errorf("annotations %v, want %v", got, tt.want)
			}
		})
	}
}

func withInit(p *corev1.Pod, c corev1.Container) *corev1.Pod {
	p.Spec.InitContainers = append(p.Spec.InitContainers, c)
	return p
}

// TestRequiredPluginsAnnotationInvalid: a list containerd cannot parse is refused, naming it.
func TestRequiredPluginsAnnotationInvalid(t *testing.T) {
	p := pod([]corev1.PodResourceClaim{podClaim("a", "vgpu", false)}, container("app", "a"))
	p.Annotations = map[string]string{"required-plugins.noderesource.dev/container.app": `{"not": "a list"}`}
	uses, err := podUses(context.Background(), specsForMutation, testSelection, "ns", p)
	if err != nil {
		t.Fatal(err)
	}
	_, err = requiredPluginsAnnotations(p, uses, testClass)
	var ae *annotationError
	if !errors.As(err, &ae) || !strings.Contains(err.Error(), "required-plugins.noderesource.dev/container.app") {
		t.Errorf("err = %v, want an annotationError naming the key", err)
	}
}

// TestAnnotationPatch: the patch adds the whole map to a pod without annotations, one escaped
// member each otherwise, and applies to give the annotations wanted.
func TestAnnotationPatch(t *testing.T) {
	set := map[string]string{"required-plugins.noderesource.dev/container.app": `["vgpu.dra.dev"]`}
	bare := pod(nil)
	ops := annotationPatch(bare, set)
	if len(ops) != 1 || ops[0].Path != "/metadata/annotations" {
		t.Fatalf("patch of a pod without annotations: %+v", ops)
	}
	withSome := pod(nil)
	withSome.Annotations = map[string]string{"keep": "me"}
	ops = annotationPatch(withSome, set)
	b, _ := json.Marshal(ops)
	want := `[{"op":"add","path":"/metadata/annotations/required-plugins.noderesource.dev~1container.app","value":"[\"vgpu.dra.dev\"]"}]`
	if string(b) != want {
		t.Errorf("patch = %s, want %s", b, want)
	}
	if annotationPatch(withSome, nil) != nil {
		t.Error("nothing to set gave a patch")
	}
}

// TestMissingClaim: a referenced claim or template that does not exist is an error naming the
// pod claim, the object and every container that references it; unreferenced ones are not
// looked up.
func TestMissingClaim(t *testing.T) {
	p := pod([]corev1.PodResourceClaim{podClaim("gone", "nope", false), podClaim("tgone", "nope", true), podClaim("unused", "nope2", false)},
		container("app", "gone", "tgone"), container("side", "gone"))
	_, err := podUses(context.Background(), specsForMutation, testSelection, "ns", p)
	var m *MissingClaimError
	if !errors.As(err, &m) {
		t.Fatalf("err = %v, want a MissingClaimError", err)
	}
	msg := err.Error()
	for _, want := range []string{`pod claim "gone" names ResourceClaim "ns/nope"`, `"app", "side"`,
		`pod claim "tgone" names ResourceClaimTemplate "ns/nope"`, "create the ResourceClaimTemplate before the pod",
		"Helm creates ResourceClaims and ResourceClaimTemplates after Pods", "Deployment, StatefulSet or Job", "pre-install hook"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "unused") {
		t.Errorf("an unreferenced pod claim was looked up: %q", msg)
	}
}

// TestLongContainerName: a vGPU container whose name makes its annotation key invalid (over 53
// characters) is refused by the mutating webhook with a message that names it and the fix,
// instead of a patch the API server would refuse; the pod annotation that already guards it,
// and a name of 53, pass.
func TestLongContainerName(t *testing.T) {
	rv := newTestReviewer(testRules, specsForMutation)
	claims := []corev1.PodResourceClaim{podClaim("a", "vgpu", false)}
	long := strings.Repeat("x", 54)
	resp := admit(t, rv, PathMutatePods, admission{kind: "Pod", obj: pod(claims, container(long, "a"))})
	if resp.Allowed || resp.Result == nil {
		t.Fatalf("a vGPU container named with 54 characters: %+v", resp)
	}
	for _, want := range []string{`container "` + long + `" uses a vGPU`, "at most 53 characters",
		`required-plugins.noderesource.dev/pod: '["vgpu.dra.dev"]'`} {
		if !strings.Contains(resp.Result.Message, want) {
			t.Errorf("message %q lacks %q", resp.Result.Message, want)
		}
	}

	fits := strings.Repeat("x", 53)
	if resp := admit(t, rv, PathMutatePods, admission{kind: "Pod", obj: pod(claims, container(fits, "a"))}); !resp.Allowed || resp.Patch == nil {
		t.Errorf("a vGPU container named with 53 characters: %+v", resp.Result)
	}
	guarded := pod(claims, container(long, "a"))
	guarded.Annotations = map[string]string{"required-plugins.noderesource.dev/pod": `["vgpu.dra.dev"]`}
	if resp := admit(t, rv, PathMutatePods, admission{kind: "Pod", obj: guarded}); !resp.Allowed || resp.Patch != nil {
		t.Errorf("a long-named container that the pod annotation guards: %+v", resp.Result)
	}
	if resp := admit(t, rv, PathMutatePods, admission{kind: "Pod", obj: pod(claims, container(long, "a"), container(strings.Repeat("y", 60)))}); resp.Allowed {
		t.Errorf("refused only for a vGPU container: %+v", resp.Result)
	}
	if resp := admit(t, rv, PathMutatePods, admission{kind: "Pod", obj: pod(claims, container("app", "a"), container(strings.Repeat("y", 60)))}); !resp.Allowed {
		t.Errorf("a long name of a container without a vGPU: %+v", resp.Result)
	}
}
