package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2/ktesting"
)

const testDNSName = "vgpu-webhook.vgpu-dra.svc"

// TestServerOverHTTPS runs the webhook with informers on a fake API server and talks to it as
// the API server does: AdmissionReviews over HTTPS, verified against the certificate's CA. It
// checks a patched, a refused and an admitted review of each webhook, malformed requests, the
// metrics, a certificate replaced while serving, and the drain at shutdown.
func TestServerOverHTTPS(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	certDir := t.TempDir()
	roots := writeTestCert(t, certDir)
	kube := fake.NewClientset(
		&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "one", Namespace: "ns"}, Spec: *specsForRules.claims["ns/one"]},
		&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "one2", Namespace: "ns"}, Spec: *specsForRules.claims["ns/one2"]},
	)
	w, err := Start(ctx, Config{Rules: testRules, Address: "127.0.0.1:0", CertDir: certDir, MissingClaimWait: 5 * time.Second,
		ShutdownDelay: 2 * time.Second, MetricsAddress: "127.0.0.1:0"}, Deps{KubeClient: kube})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the webhook to be ready", func() error { return w.Ready(ctx) })
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: testDNSName}}}
	base := "https://" + w.Addr.String()

	vgpuPod := pod([]corev1.PodResourceClaim{podClaim("gpu", "one", false)}, container("app", "gpu"))
	resp := postReview(t, client, base+PathMutatePods, "Pod", vgpuPod)
	if !resp.Allowed || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("mutate a vGPU pod: %+v", resp)
	}
	var ops []patchOperation
	if err := json.Unmarshal(resp.Patch, &ops); err != nil {
		t.Fatal(err)
	}
	wantValue := map[string]any{"required-plugins.noderesource.dev/container.app": `["vgpu.dra.dev"]`}
	if len(ops) != 1 || ops[0].Op != "add" || ops[0].Path != "/metadata/annotations" || !equalJSON(ops[0].Value, wantValue) {
		t.Errorf("patch %s, want the annotation added", resp.Patch)
	}
	if resp := postReview(t, client, base+PathMutatePods, "Pod", pod(nil, container("app"))); !resp.Allowed || resp.Patch != nil {
		t.Errorf("mutate a pod without a vGPU: %+v", resp)
	}

	twoClaims := pod([]corev1.PodResourceClaim{podClaim("a", "one", false), podClaim("b", "one2", false)}, container("app", "a", "b"))
	resp = postReview(t, client, base+PathValidatePods, "Pod", twoClaims)
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusForbidden || !strings.Contains(resp.Result.Message, `container "app" uses 2 vGPU claims`) {
		t.Errorf("validate a pod with two vGPU claims: %+v", resp)
	}
	if resp := postReview(t, client, base+PathValidatePods, "Pod", vgpuPod); !resp.Allowed {
		t.Errorf("validate a valid vGPU pod: %+v", resp.Result)
	}

	// A claim created while its pod is reviewed is found (the review waits for the cache).
	late := pod([]corev1.PodResourceClaim{podClaim("gpu", "late", false)}, container("app", "gpu"))
	go func() {
		_, _ = kube.ResourceV1().ResourceClaims("ns").Create(ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: "ns"}, Spec: *specsForRules.claims["ns/one"]}, metav1.CreateOptions{})
	}()
	if resp := postReview(t, client, base+PathMutatePods, "Pod", late); !resp.Allowed || resp.Patch == nil {
		t.Errorf("mutate a pod whose claim is created meanwhile: %+v", resp.Result)
	}

	badClaim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: "ns"},
		Spec: *spec([]resourceapi.DeviceRequest{request("gpu", testClass, 1, "128Mi", "10")})}
	if resp := postReview(t, client, base+PathValidateClaims, "ResourceClaim", badClaim); resp.Allowed || !strings.Contains(resp.Result.Message, `ResourceClaim "ns/small": request "gpu" asks for memory 128Mi`) {
		t.Errorf("validate a claim below the minimum: %+v", resp.Result)
	}
	goodTemplate := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "ns"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: *specsForRules.claims["ns/one"]}}
	if resp := postReview(t, client, base+PathValidateClaimTemplates, "ResourceClaimTemplate", goodTemplate); !resp.Allowed {
		t.Errorf("validate a valid template: %+v", resp.Result)
	}
	// A review of the wrong kind fails closed; a body that is no review is a 400.
	if resp := postReview(t, client, base+PathValidateClaims, "Pod", vgpuPod); resp.Allowed || resp.Result.Code != http.StatusInternalServerError {
		t.Errorf("a Pod sent to the ResourceClaim webhook: %+v", resp)
	}
	if r, err := client.Post(base+PathValidatePods, "application/json", strings.NewReader("{")); err != nil || r.StatusCode != http.StatusBadRequest {
		t.Errorf("malformed review: %v %v", r, err)
	}

	metrics := get(t, http.DefaultClient, "http://"+w.MetricsAddr.String()+"/metrics")
	for _, want := range []string{
		`vgpu_dra_webhook_admissions_total{decision="patched",kind="Pod",webhook="mutating"} 2`,
		`vgpu_dra_webhook_admissions_total{decision="allowed",kind="Pod",webhook="mutating"} 1`,
		`vgpu_dra_webhook_admissions_total{decision="denied",kind="Pod",webhook="validating"} 1`,
		`vgpu_dra_webhook_admissions_total{decision="denied",kind="ResourceClaim",webhook="validating"} 1`,
		`vgpu_dra_webhook_admissions_total{decision="error",kind="ResourceClaim",webhook="validating"} 1`,
		`vgpu_dra_webhook_admissions_total{decision="error",kind="Pod",webhook="validating"} 1`,
		`vgpu_dra_webhook_denials_total{reason="two_claims"} 1`,
		`vgpu_dra_webhook_denials_total{reason="capacity"} 1`,
		`vgpu_dra_webhook_admission_duration_seconds_count{kind="Pod",webhook="mutating"} 3`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// A certificate written while serving is served from the next handshake on, no restart.
	before, err := servedSerial(w.Addr.String(), roots)
	if err != nil {
		t.Fatal(err)
	}
	roots2 := writeTestCert(t, certDir)
	eventually(t, "the new certificate to be served", func() error {
		serial, err := servedSerial(w.Addr.String(), roots2)
		if err == nil && serial == before {
			err = errors.New("the old certificate is still served")
		}
		return err
	})

	// Shutdown: unready, still answering during the delay, then stopped.
	cancel()
	eventually(t, "readiness to report the shutdown", func() error {
		if err := w.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "shutting down") {
			return fmt.Errorf("readiness %v", err)
		}
		return nil
	})
	client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots2, ServerName: testDNSName}}}
	if resp := postReview(t, client, base+PathMutatePods, "Pod", pod(nil, container("app"))); !resp.Allowed {
		t.Errorf("review during the drain: %+v", resp)
	}
	if err := w.Wait(); err != nil {
		t.Errorf("Wait = %v", err)
	}
}

// writeTestCert writes a fresh self-signed certificate for testDNSName into dir the way the
// Secret mirror does, and returns a pool that trusts it.
func writeTestCert(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	cert, key, err := certutil.GenerateSelfSignedCertKey(testDNSName, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeCertDir(dir, cert, key); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cert) {
		t.Fatal("no certificate in the generated PEM")
	}
	return pool
}

// postReview sends obj as the object of a CREATE review of kind and returns the response.
func postReview(t *testing.T, client *http.Client, url, kind string, obj runtime.Object) *admissionv1.AdmissionResponse {
	t.Helper()
	r, err := client.Post(url, "application/json", bytes.NewReader(reviewBody(t, kind, obj)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&out); err != nil || out.Response == nil {
		t.Fatalf("POST %s: status %d, decode: %v", url, r.StatusCode, err)
	}
	if out.Response.UID != "uid-1" || out.Kind != "AdmissionReview" {
		t.Errorf("response uid %q kind %q: must echo the request's", out.Response.UID, out.Kind)
	}
	return out.Response
}

func get(t *testing.T, client *http.Client, url string) string {
	t.Helper()
	r, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

// servedSerial is the serial number of the certificate the server presents, and the error of
// verifying it against roots for testDNSName.
func servedSerial(addr string, roots *x509.CertPool) (string, error) {
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // verified below
	if err != nil {
		return "", err
	}
	defer conn.Close()
	leaf := conn.ConnectionState().PeerCertificates[0]
	_, err = leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: testDNSName})
	return leaf.SerialNumber.String(), err
}

func equalJSON(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// eventually polls cond until it returns nil, failing the test after 30 s.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
