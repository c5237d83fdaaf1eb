package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2/ktesting"

	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// admission is one AdmissionRequest for a test: the operation, the object and, for an UPDATE,
// the object before it.
type admission struct {
	kind        string
	op          admissionv1.Operation
	subResource string
	obj, old    runtime.Object
}

// admit sends the request to path of the reviewer, as the API server does, and returns the
// response.
func admit(t *testing.T, rv *Reviewer, path string, a admission) *admissionv1.AdmissionResponse {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	req := &admissionv1.AdmissionRequest{UID: "u", Kind: metav1.GroupVersionKind{Kind: a.kind}, Namespace: "ns", Name: "x",
		Operation: a.op, SubResource: a.subResource}
	if req.Operation == "" {
		req.Operation = admissionv1.Create
	}
	req.Object.Raw, _ = json.Marshal(a.obj)
	if a.old != nil {
		req.OldObject.Raw, _ = json.Marshal(a.old)
	}
	body, _ := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
	rec := httptest.NewRecorder()
	rv.Handler(ctx).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(rec.Body).Decode(&out); err != nil || out.Response == nil {
		t.Fatalf("POST %s: status %d, decode: %v", path, rec.Code, err)
	}
	return out.Response
}

// newTestReviewer reviews with rules against specs, counting into a registry of its own.
func newTestReviewer(rules Rules, specs Specs) *Reviewer {
	return NewReviewer(rules, specs, nil, metrics.NewWebhookMetrics(component.NewMetricsRegistry()))
}
