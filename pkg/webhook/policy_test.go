package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// reviewPod posts one AdmissionReview of a pod (CREATE, or UPDATE of the ephemeralcontainers
// subresource) to the validating path of a reviewer with the policy.
func reviewPod(t *testing.T, policy ContainerPolicy, p *corev1.Pod, ephemeral bool) *admissionv1.AdmissionResponse {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	rules := testRules
	rules.ContainerPolicy = policy
	srv := httptest.NewServer(NewReviewer(rules, specsForRules, nil, metrics.NewWebhookMetrics(component.NewMetricsRegistry())).Handler(ctx))
	defer srv.Close()
	raw, _ := json.Marshal(p)
	req := &admissionv1.AdmissionRequest{UID: "u", Kind: metav1.GroupVersionKind{Kind: "Pod"}, Namespace: "ns", Name: "x",
		Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}
	if ephemeral {
		req.Operation, req.SubResource = admissionv1.Update, "ephemeralcontainers"
	}
	body, _ := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
	r, err := http.Post(srv.URL+PathValidatePods, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&out); err != nil || out.Response == nil {
		t.Fatalf("decode: %v", err)
	}
	return out.Response
}

// TestContainerPolicy: each policy refuses, with a message naming the container and the fix,
// what it must, admits what it allows, and audit admits everything with a warning for a root
// container on a writable root file system.
func TestContainerPolicy(t *testing.T) {
	claims := []corev1.PodResourceClaim{podClaim("gpu", "one", false)}
	rootRW := pod(claims, container("app", "gpu"))
	readOnly := pod(claims, container("app", "gpu"))
	readOnly.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr.To(true)}
	nonRootPod := pod(claims, container("app", "gpu"))
	nonRootPod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)}
	userZero := pod(claims, container("app", "gpu"))
	userZero.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)}
	userZero.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)}
	noGPU := pod(nil, container("app"))
	tests := []struct {
		name    string
		policy  ContainerPolicy
		pod     *corev1.Pod
		refused string // substring of the refusal; empty: admitted
		warning string // substring of a warning; empty: none
	}{
		{"audit warns about root on a writable root", PolicyAudit, rootRW, "", `container "app" uses a vGPU as root on a writable root file system`},
		{"audit, read-only root", PolicyAudit, readOnly, "", ""},
		{"audit, non-root", PolicyAudit, nonRootPod, "", ""},
		{"empty policy is audit", "", rootRW, "", "can unload the vGPU library"},
		{"read-only root required", PolicyReadOnlyRoot, rootRW, `container "app" uses a vGPU and its root file system is writable`, ""},
		{"read-only root given", PolicyReadOnlyRoot, readOnly, "", ""},
		{"non-root required", PolicyNonRoot, rootRW, `container "app" uses a vGPU and may run as root`, ""},
		{"non-root from the pod", PolicyNonRoot, nonRootPod, "", ""},
		{"runAsUser 0 beats the pod's runAsNonRoot", PolicyNonRoot, userZero, "may run as root", ""},
		{"no vGPU, no policy", PolicyReadOnlyRoot, noGPU, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := reviewPod(t, tt.policy, tt.pod, false)
			if tt.refused == "" {
				if !resp.Allowed {
					t.Fatalf("refused: %s", resp.Result.Message)
				}
			} else if resp.Allowed || !strings.Contains(resp.Result.Message, tt.refused) {
				t.Fatalf("allowed=%v %+v, want a refusal with %q", resp.Allowed, resp.Result, tt.refused)
			}
			got := strings.Join(resp.Warnings, "\n")
			if (tt.warning == "") != (got == "") || !strings.Contains(got, tt.warning) {
				t.Errorf("warnings %q, want %q", resp.Warnings, tt.warning)
			}
		})
	}
}

// TestEphemeralContainers: an ephemeral container added to a vGPU pod (pods/ephemeralcontainers
// is an UPDATE of its own admission path) is refused under a require- policy and warned about
// under audit; a pod without vGPU containers may have them.
func TestEphemeralContainers(t *testing.T) {
	withDebug := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "busybox"}}}
		return p
	}
	vgpu := withDebug(pod([]corev1.PodResourceClaim{podClaim("gpu", "one", false)}, container("app", "gpu")))
	if resp := reviewPod(t, PolicyReadOnlyRoot, vgpu, true); resp.Allowed || !strings.Contains(resp.Result.Message, `ephemeral container(s) ["debugger"]`) {
		t.Errorf("require-readonly-root: %+v, want the ephemeral container refused", resp.Result)
	}
	if resp := reviewPod(t, PolicyAudit, vgpu, true); !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "/proc/<pid>/root") {
		t.Errorf("audit: allowed=%v warnings %q", resp.Allowed, resp.Warnings)
	}
	if resp := reviewPod(t, PolicyNonRoot, withDebug(pod(nil, container("app"))), true); !resp.Allowed {
		t.Errorf("a pod without vGPU containers: %+v", resp.Result)
	}
}
