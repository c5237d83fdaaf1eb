package webhook

import (
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestGuardKeptOnUpdate: a pod UPDATE that takes the required-plugins guard away from a
// container that had it is refused, naming the container; every other update is admitted,
// without looking up a claim (the claim of this pod does not exist).
func TestGuardKeptOnUpdate(t *testing.T) {
	const key = "required-plugins.noderesource.dev/container.app"
	const podKey = "required-plugins.noderesource.dev/pod"
	withAnnotations := func(a map[string]string) *corev1.Pod {
		p := pod([]corev1.PodResourceClaim{podClaim("gpu", "gone", false)}, container("app", "gpu"), container("side"))
		p.Annotations = a
		return p
	}
	guardedPod := withAnnotations(map[string]string{key: `["vgpu.dra.dev"]`, "team": "a"})
	tests := []struct {
		name        string
		old, pod    *corev1.Pod
		subResource string
		nri         bool
		refused     bool
	}{
		{name: "annotation removed", old: guardedPod, pod: withAnnotations(map[string]string{"team": "a"}), nri: true, refused: true},
		{name: "all annotations removed", old: guardedPod, pod: withAnnotations(nil), nri: true, refused: true},
		{name: "value changed to another plugin", old: guardedPod, pod: withAnnotations(map[string]string{key: `["other"]`}), nri: true, refused: true},
		{name: "value changed to what does not parse", old: guardedPod, pod: withAnnotations(map[string]string{key: `{`}), nri: true, refused: true},
		{name: "pod key guarded it, a container key without the plugin hides it",
			old: withAnnotations(map[string]string{podKey: `["vgpu.dra.dev"]`}),
			pod: withAnnotations(map[string]string{podKey: `["vgpu.dra.dev"]`, key: `["x"]`}), nri: true, refused: true},
		{name: "negative: another annotation changed", old: guardedPod, pod: withAnnotations(map[string]string{key: `["vgpu.dra.dev"]`, "team": "b"}), nri: true},
		{name: "negative: list extended, still naming the plugin", old: guardedPod, pod: withAnnotations(map[string]string{key: `["vgpu.dra.dev", "x"]`}), nri: true},
		{name: "negative: guard moved to the pod key", old: guardedPod, pod: withAnnotations(map[string]string{podKey: `["vgpu.dra.dev"]`}), nri: true},
		{name: "negative: never guarded", old: withAnnotations(map[string]string{"team": "a"}), pod: withAnnotations(nil), nri: true},
		{name: "negative: NRI off, no guard to keep", old: guardedPod, pod: withAnnotations(nil)},
		{name: "negative: the status subresource", old: guardedPod, pod: withAnnotations(nil), subResource: "status", nri: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules := testRules
			if !tt.nri {
				rules.RequiredPlugin = ""
			}
			resp := admit(t, newTestReviewer(rules, fakeSpecs{}), PathValidatePods,
				admission{kind: "Pod", op: admissionv1.Update, subResource: tt.subResource, obj: tt.pod, old: tt.old})
			switch {
			case tt.refused && (resp.Allowed || resp.Result == nil):
				t.Fatalf("admitted: %+v", resp)
			case tt.refused:
				for _, want := range []string{`container(s) "app"`, `named the NRI plugin "vgpu.dra.dev"`} {
					if !strings.Contains(resp.Result.Message, want) {
						t.Errorf("message %q lacks %q", resp.Result.Message, want)
					}
				}
				if strings.Contains(resp.Result.Message, `"side"`) {
					t.Errorf("message %q names a container that was never guarded", resp.Result.Message)
				}
			case !resp.Allowed:
				t.Errorf("refused: %+v", resp.Result)
			}
		})
	}
}
