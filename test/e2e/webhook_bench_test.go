//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// BenchmarkWebhookAdmission measures what the webhook adds to admitting a vGPU pod on the real
// API server (`make bench-webhook`): the same pod created with dry run (admission in full,
// nothing stored) in our namespace, where the mutating and the validating webhook review it, and
// in kube-system, which they never see; then the pod's two reviews sent straight to one replica
// over HTTPS, as the API server sends them. It reports p50/p99 of each, and logs the webhook
// calls as the API server's and the webhook's own histograms see them (bucket bounds). Figures
// go to docs/performance.md; nothing here asserts a time.
func BenchmarkWebhookAdmission(b *testing.B) {
	ctx := context.Background()
	installChart(b)
	ensureNamespace(b)
	if _, err := kube.ResourceV1().ResourceClaims(testNS).Create(ctx, claimFor("bench", "1Gi", 10), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	pod := vgpuPod("bench", "bench")
	pod.Spec.AutomountServiceAccountToken = ptrTo(false)
	// Unthrottled: the suite's client waits 20 ms per request at 50 QPS, which would be all
	// this measures.
	rc := rest.CopyConfig(restConfig)
	rc.RateLimiter = flowcontrol.NewFakeAlwaysRateLimiter()
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	create := func(ns string) (*corev1.Pod, error) {
		p := pod.DeepCopy()
		p.Namespace = ns
		return client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	}
	for _, c := range []struct{ name, ns string }{{"vgpu-pod-reviewed", testNS}, {"same-pod-not-reviewed", "kube-system"}} {
		b.Run(c.name, func(b *testing.B) {
			for range 50 { // connections, caches
				if _, err := create(c.ns); err != nil {
					b.Fatal(err)
				}
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				p, err := create(c.ns)
				lat = append(lat, time.Since(start))
				if err != nil || (c.ns == testNS && p.Annotations[requiredPlugins] == "") {
					b.Fatalf("create: %v, annotations %v", err, p.Annotations)
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
			b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
		})
	}

	// Both reviews of the pod sent to one replica as the API server sends them: HTTPS on a kept
	// connection, the certificate verified against the caBundle.
	b.Run("reviews-at-the-webhook", func(b *testing.B) {
		roots, _ := webhookCA(b)
		replica := webhookPods(b)[0]
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: webhookName + "." + pluginNS + ".svc"}}}
		review := admissionReview(b, pod)
		post := func(path string) {
			resp, err := hc.Post("https://"+net.JoinHostPort(replica.Status.PodIP, "8443")+path, "application/json", bytes.NewReader(review))
			if err != nil {
				b.Fatal(err)
			}
			var out admissionv1.AdmissionReview
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if err != nil || out.Response == nil || !out.Response.Allowed {
				b.Fatalf("%s: %v %+v", path, err, out.Response)
			}
		}
		for range 50 {
			post("/mutate/pods")
		}
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			post("/mutate/pods")
			post("/validate/pods")
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
		b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
	})

	// The webhook calls alone: the API server's histogram of them (buckets 5 ms, 25 ms, ...)
	// and the webhook's own (from 25 µs, doubling).
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"required-plugins." + driverName, "pods." + driverName} {
		h := histogram(string(raw), "apiserver_admission_webhook_admission_duration_seconds", `name="`+name+`"`, `rejected="false"`)
		b.Logf("API server, webhook %s: %d calls, %.1f%% within 5 ms, %.1f%% within 25 ms; p50 ≤ %s, p99 ≤ %s",
			name, h.total, 100*h.fraction(0.005), 100*h.fraction(0.025), h.quantile(0.5), h.quantile(0.99))
	}
	own := webhookMetrics(b)
	for _, wh := range []string{"mutating", "validating"} {
		h := histogram(own, "vgpu_dra_webhook_admission_duration_seconds", `kind="Pod"`, `webhook="`+wh+`"`)
		b.Logf("vgpu-webhook, %s Pod reviews: %d, p50 ≤ %s, p99 ≤ %s", wh, h.total, h.quantile(0.5), h.quantile(0.99))
	}
	_ = kube.ResourceV1().ResourceClaims(testNS).Delete(ctx, "bench", metav1.DeleteOptions{})
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// admissionReview is the review of creating pod in the test namespace, as the API server sends it.
func admissionReview(b *testing.B, pod *corev1.Pod) []byte {
	b.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		b.Fatal(err)
	}
	out, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "bench", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: testNS, Name: pod.Name,
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}},
	})
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// bucketCounts is a cumulative histogram: upper bound (seconds) → count, summed over every series
// that matched.
type bucketCounts struct {
	bounds []float64
	counts map[float64]uint64
	total  uint64
}

// histogram sums the _bucket lines of metric whose labels contain every one of labels.
func histogram(text, metric string, labels ...string) bucketCounts {
	h := bucketCounts{counts: map[float64]uint64{}}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, metric+"_bucket{") || !containsAll(line, labels) {
			continue
		}
		i := strings.Index(line, `le="`)
		j := strings.Index(line, "} ")
		if i < 0 || j < 0 {
			continue
		}
		le := line[i+4 : i+4+strings.IndexByte(line[i+4:], '"')]
		count, err := strconv.ParseFloat(strings.TrimSpace(line[j+2:]), 64)
		if err != nil {
			continue
		}
		bound := inf
		if le != "+Inf" {
			if bound, err = strconv.ParseFloat(le, 64); err != nil {
				continue
			}
		}
		if _, ok := h.counts[bound]; !ok {
			h.bounds = append(h.bounds, bound)
		}
		h.counts[bound] += uint64(count)
	}
	slices.Sort(h.bounds)
	if len(h.bounds) > 0 {
		h.total = h.counts[h.bounds[len(h.bounds)-1]]
	}
	return h
}

var inf = 1e308

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// fraction of the observations at or below bound.
func (h bucketCounts) fraction(bound float64) float64 {
	if h.total == 0 {
		return 0
	}
	return float64(h.counts[bound]) / float64(h.total)
}

// quantile is the smallest bucket bound that holds at least q of the observations.
func (h bucketCounts) quantile(q float64) string {
	for _, b := range h.bounds {
		if float64(h.counts[b]) >= q*float64(h.total) && h.total > 0 {
			if b == inf {
				return "+Inf"
			}
			return fmt.Sprint(time.Duration(b * float64(time.Second)))
		}
	}
	return "n/a"
}
