package webhook

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// TestClaimReplacedAfterItsPod: a claim created after a pod that will use it — created again
// under the name the pod names, or made from a template replaced since the pod's admission —
// is refused when the pod would now be refused or would get a vGPU without its annotation,
// naming the pod, the container and the fix; a claim that keeps what the pod was admitted with,
// one whose pod is gone, and the scheduler's claim for the extended resource are admitted.
func TestClaimReplacedAfterItsPod(t *testing.T) {
	const guard = "required-plugins.noderesource.dev/container.app"
	withMeta := func(p *corev1.Pod, name string, uid types.UID, annotations map[string]string) *corev1.Pod {
		p.Name, p.UID, p.Annotations = name, uid, annotations
		return p
	}
	// Admitted when "net" was another driver's claim: no guard.
	unguarded := withMeta(pod([]corev1.PodResourceClaim{podClaim("c", "net", false)}, container("app", "c")), "unguarded", "u1", nil)
	// Admitted with the vGPU claim "one" and "net" of another driver in one container.
	twoOnce := withMeta(pod([]corev1.PodResourceClaim{podClaim("a", "one", false), podClaim("b", "net2", false)}, container("app", "a", "b")),
		"two", "u2", map[string]string{guard: `["vgpu.dra.dev"]`})
	// Admitted with a vGPU template that has one request.
	fromTemplate := withMeta(pod([]corev1.PodResourceClaim{podClaim("gpu", "tmpl", true)}, container("app", "gpu")),
		"templated", "u3", map[string]string{guard: `["vgpu.dra.dev"]`})
	finished := withMeta(pod([]corev1.PodResourceClaim{podClaim("c", "done", false)}, container("app", "c")), "finished", "u4", nil)
	finished.Status.Phase = corev1.PodSucceeded
	kube := fake.NewClientset(unguarded, twoOnce, fromTemplate, finished,
		withMeta(pod(nil, container("plain")), "plain", "u5", nil))
	specs := fakeSpecs{claims: map[string]*resourceapi.ResourceClaimSpec{"ns/one": specsForRules.claims["ns/one"]},
		templates: map[string]*resourceapi.ResourceClaimSpec{"ns/tmpl": specsForRules.claims["ns/one"]}}
	rv := NewReviewer(testRules, specs, apiPods{client: kube}, metrics.NewWebhookMetrics(component.NewMetricsRegistry()))

	claim := func(name string, s *resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}, Spec: *s}
	}
	madeFor := func(p *corev1.Pod, uid types.UID, s *resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaim {
		c := claim(p.Name+"-gpu-x7k2q", s)
		c.Annotations = map[string]string{annotationPodClaimName: "gpu"}
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: uid, Controller: ptr.To(true)}}
		return c
	}
	extended := claim("templated-extended-resource-abcde", specsForRules.claims["ns/two"])
	extended.Annotations = map[string]string{annotationExtendedResource: "vgpu.dra.dev/vgpu"}
	extended.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "templated", UID: "u3", Controller: ptr.To(true)}}

	vgpu, two := specsForRules.claims["ns/one"], specsForRules.claims["ns/two"]
	tests := []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  []string // substrings of the refusal; nil: admitted
	}{
		{name: "named claim now of our class, its pod unguarded", claim: claim("net", vgpu),
			want: []string{`pod "ns/unguarded" uses this claim`, `container "app" would get a vGPU`, "no required-plugins annotation", "delete the pod and create it again"}},
		{name: "named claim now a second vGPU claim of a container", claim: claim("net2", vgpu),
			want: []string{`pod "ns/two" uses this claim`, `container "app" uses 2 vGPU claims`}},
		{name: "template replaced by one without a distinct constraint", claim: madeFor(fromTemplate, "u3", two),
			want: []string{`pod "ns/templated" uses this claim`, `vGPU request(s) "a", "b"`}},
		{name: "negative: template as the pod was admitted with", claim: madeFor(fromTemplate, "u3", vgpu)},
		{name: "negative: made for a pod of that name that is gone", claim: madeFor(fromTemplate, "other-uid", two)},
		{name: "negative: named claim that no pod names yet", claim: claim("fresh", two)},
		{name: "negative: the pod that names it has finished", claim: claim("done", vgpu)},
		{name: "negative: the scheduler's claim for the extended resource", claim: extended},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := admit(t, rv, PathValidateClaims, admission{kind: "ResourceClaim", obj: tt.claim})
			if tt.want == nil {
				if !resp.Allowed {
					t.Errorf("refused: %+v", resp.Result)
				}
				return
			}
			if resp.Allowed || resp.Result == nil {
				t.Fatalf("admitted")
			}
			for _, w := range tt.want {
				if !strings.Contains(resp.Result.Message, w) {
					t.Errorf("message %q lacks %q", resp.Result.Message, w)
				}
			}
		})
	}
}
