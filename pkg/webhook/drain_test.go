package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
)

// TestRolloutLosesNoReview replaces one webhook pod by another while reviews keep coming, the way
// a helm upgrade does, and requires every review to be answered. The client is the API server's:
// HTTP/1.1 with keep-alive (the API server turns HTTP/2 off for webhooks) and no retry of a POST
// whose connection the server closed. Its dialer plays kube-proxy: once the old pod drains, new
// connections go to the new one; the connections already open stay on the old pod. A server that
// closes a kept-alive connection at its shutdown while a review is on its way loses that review
// ("Post ...: EOF", kubernetes/kubernetes#127335).
func TestRolloutLosesNoReview(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	certDir := t.TempDir()
	roots := writeTestCert(t, certDir)
	start := func(ctx context.Context) *Webhook {
		w, err := Start(ctx, Config{Rules: testRules, Address: "127.0.0.1:0", CertDir: certDir, MissingClaimWait: time.Second,
			ShutdownDelay: 300 * time.Millisecond}, Deps{KubeClient: fake.NewClientset()})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, "the webhook to be ready", func() error { return w.Ready(ctx) })
		return w
	}
	oldCtx, stopOld := context.WithCancel(ctx)
	defer stopOld()
	old := start(oldCtx)
	newCtx, stopNew := context.WithCancel(ctx)
	replacement := start(newCtx)
	defer func() { stopNew(); _ = replacement.Wait() }()

	var oldGone atomic.Bool // the endpoints no longer list the old pod
	dialer := &net.Dialer{}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: roots, ServerName: testDNSName, NextProtos: []string{"http/1.1"}},
		MaxIdleConnsPerHost: 100,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			addr := old.Addr.String()
			if oldGone.Load() {
				addr = replacement.Addr.String()
			}
			return dialer.DialContext(ctx, network, addr)
		},
	}}
	body := reviewBody(t, "Pod", pod(nil, container("app")))

	var (
		wg       sync.WaitGroup
		answered atomic.Int64
		mu       sync.Mutex
		failures []error
	)
	done := make(chan struct{})
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if err := postOnce(client, "https://webhook"+PathMutatePods, body); err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
				} else {
					answered.Add(1)
				}
				// Bursts and pauses, so that some connections sit idle when the old pod stops.
				if i%4 == 3 {
					time.Sleep(time.Duration(i%7) * 3 * time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	stopOld() // SIGTERM: the old pod turns unready and drains
	eventually(t, "the old pod to report the shutdown", func() error {
		if old.Ready(ctx) == nil {
			return fmt.Errorf("still ready")
		}
		return nil
	})
	oldGone.Store(true) // the endpoints controller and kube-proxy catch up
	if err := old.Wait(); err != nil {
		t.Errorf("old webhook: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	close(done)
	wg.Wait()
	t.Logf("%d reviews answered across the rollout, %d lost", answered.Load(), len(failures))
	for i, err := range failures {
		if i == 5 {
			t.Errorf("... and %d more", len(failures)-5)
			break
		}
		t.Errorf("review lost across the rollout: %v", err)
	}
	if answered.Load() < 100 {
		t.Errorf("only %d reviews sent: the test did not load the rollout", answered.Load())
	}
}

// reviewBody is a CREATE review of obj, of kind, as the API server posts it.
func reviewBody(t *testing.T, kind string, obj runtime.Object) []byte {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "uid-1", Kind: metav1.GroupVersionKind{Kind: kind},
			Namespace: "ns", Name: "x", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// postOnce posts a review and checks that an allowing response came back.
func postOnce(client *http.Client, url string, body []byte) error {
	r, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer r.Body.Close()
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return fmt.Errorf("read the response: %w", err)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(raw, &out); err != nil || out.Response == nil || !out.Response.Allowed {
		return fmt.Errorf("status %d, response %q (%v)", r.StatusCode, raw, err)
	}
	return nil
}
