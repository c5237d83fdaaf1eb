//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// refusal is a manifest the webhook must refuse, and what kubectl must then say.
type refusal struct {
	name     string
	manifest string
	want     []string
}

// refusals covers every rule of contract §12 on the real API server. The claims r1, r2 (one
// request each) and pair (two requests, no constraint) exist.
func refusals() []refusal {
	claimRequests := func(kind, name, capacity string) string {
		spec := `devices: {requests: [{name: gpu, exactly: {deviceClassName: ` + driverName + `, capacity: {requests: {` + capacity + `}}}}]}`
		if kind == "ResourceClaimTemplate" {
			spec = "spec: {" + spec + "}"
		}
		return fmt.Sprintf("apiVersion: resource.k8s.io/v1\nkind: %s\nmetadata: {name: %s, namespace: %s}\nspec: {%s}\n", kind, name, testNS, spec)
	}
	pod := func(name, annotations, claims, refs, env string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, annotations: {%s}}
spec:
  resourceClaims: [%s]
  containers:
    - name: app
      image: %s
      imagePullPolicy: Never
      resources: {claims: [%s]}
      env: [%s]
`, name, testNS, annotations, claims, workloadImage, refs, env)
	}
	return []refusal{
		{"claim below the minimum memory", claimRequests("ResourceClaim", "bad-memory", `memory: 100Mi, cores: "10"`),
			[]string{`admission webhook "resourceclaims.` + driverName + `"`, `ResourceClaim "vgpu-e2e/bad-memory": request "gpu" asks for memory 100Mi, below the smallest vGPU share of 256Mi`}},
		{"template with memory not in whole Mi", claimRequests("ResourceClaimTemplate", "bad-step", `memory: "1000000000"`),
			[]string{`admission webhook "resourceclaimtemplates.` + driverName + `"`, "not a whole number of Mi", "ask for a multiple of 1Mi"}},
		{"template above 100 cores", claimRequests("ResourceClaimTemplate", "bad-cores", `cores: "150"`),
			[]string{`ResourceClaimTemplate "vgpu-e2e/bad-cores": request "gpu" asks for cores 150`, "no GPU can satisfy it"}},
		{"two vGPU claims in one container", pod("two-claims", "", "{name: a, resourceClaimName: r1}, {name: b, resourceClaimName: r2}", "{name: a}, {name: b}", ""),
			[]string{`admission webhook "pods.` + driverName + `"`, `container "app" uses 2 vGPU claims, pod claim "a" (ResourceClaim "vgpu-e2e/r1") and pod claim "b" (ResourceClaim "vgpu-e2e/r2")`}},
		{"two requests without distinctAttribute", pod("pair", "", "{name: gpu, resourceClaimName: pair}", "{name: gpu}", ""),
			[]string{`container "app" gets vGPU request(s) "a", "b" of pod claim "gpu" (ResourceClaim "vgpu-e2e/pair")`, `{requests: ["a", "b"], distinctAttribute: "vgpu.dra.dev/uuid"}`}},
		{"contract env", pod("env", "", "{name: gpu, resourceClaimName: r1}", "{name: gpu}", "{name: MANAGER_VGPU_CLAIM_UID, value: forged}, {name: CUDA_MEM_LIMIT_0, value: 1g}"),
			[]string{`container "app" uses a vGPU and sets MANAGER_VGPU_CLAIM_UID, CUDA_MEM_LIMIT_0 in its env`}},
		{"claim that does not exist", pod("missing", "", "{name: gpu, resourceClaimName: nope}", "{name: gpu}", ""),
			[]string{`admission webhook "required-plugins.` + driverName + `"`, `pod claim "gpu" names ResourceClaim "vgpu-e2e/nope", which does not exist`, "create the ResourceClaim before the pod"}},
		{"required-plugins annotation that is no list", pod("bad-annotation", `required-plugins.noderesource.dev/container.app: "not-a-list"`, "{name: gpu, resourceClaimName: r1}", "{name: gpu}", ""),
			[]string{`annotation "required-plugins.noderesource.dev/container.app" is "not-a-list", not a list of NRI plugin names`}},
	}
}

// pairClaim is a claim with two vGPU requests, a and b, under a distinctAttribute constraint on
// the UUID or not.
func pairClaim(name string, distinct bool) *resourceapi.ResourceClaim {
	c := claimFor(name, "1Gi", 10)
	a := c.Spec.Devices.Requests[0]
	a.Name = "a"
	b := *a.DeepCopy()
	b.Name = "b"
	c.Spec.Devices.Requests = []resourceapi.DeviceRequest{a, b}
	if distinct {
		attr := resourceapi.FullyQualifiedName(driverName + "/uuid")
		c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{"a", "b"}, DistinctAttribute: &attr}}
	}
	return c
}

// kubectlApply applies a manifest from stdin, as a user would, and returns what kubectl says.
func kubectlApply(t testing.TB, manifest string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kubectl"), "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// dryRunCreate creates the pod in ns with dry run: admission runs in full, nothing is stored.
func dryRunCreate(ctx context.Context, ns string, p *corev1.Pod) (*corev1.Pod, error) {
	p = p.DeepCopy()
	p.Namespace = ns
	return kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
}

// webhookPods lists the webhook's Ready pods that are not terminating.
func webhookPods(t testing.TB) []corev1.Pod {
	t.Helper()
	list, err := kube.CoreV1().Pods(pluginNS).List(context.Background(), metav1.ListOptions{LabelSelector: webhookSelector})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && podReady(&p) && p.Status.PodIP != "" {
			out = append(out, p)
		}
	}
	return out
}

// webhookMetrics is what every webhook replica's /metrics says, one after the other.
func webhookMetrics(t testing.TB) string {
	t.Helper()
	var all strings.Builder
	for _, p := range webhookPods(t) {
		b, err := scraper.Get(context.Background(), net.JoinHostPort(p.Status.PodIP, "8080"))
		if err != nil {
			t.Fatalf("metrics of %s: %v", p.Name, err)
		}
		all.Write(b)
	}
	return all.String()
}

// webhookCA is the caBundle of the mutating webhook, as a pool and as text.
func webhookCA(t testing.TB) (*x509.CertPool, string) {
	t.Helper()
	m, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), webhookName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bundle := m.Webhooks[0].ClientConfig.CABundle
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatalf("caBundle of %s holds no certificate", webhookName)
	}
	return pool, string(bundle)
}

// servedCerts maps each Ready replica to the SHA-256 of the certificate it serves, verified as
// the API server verifies it (the Service's DNS name, the caBundle), or to "error: ...".
// (cert-controller gives every serving certificate serial number 1: serials cannot tell them
// apart.)
func servedCerts(t testing.TB, roots *x509.CertPool) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range webhookPods(t) {
		out[p.Name] = servedCert(net.JoinHostPort(p.Status.PodIP, "8443"), roots)
	}
	return out
}

func servedCert(addr string, roots *x509.CertPool) string {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // verified below
	if err != nil {
		return "error: " + err.Error()
	}
	defer conn.Close()
	leaf := conn.ConnectionState().PeerCertificates[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: webhookName + "." + pluginNS + ".svc"}); err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%x", sha256.Sum256(leaf.Raw))[:16]
}

// extendedResourceLimits asks for n whole GPUs through the DeviceClass's extended resource.
func extendedResourceLimits(n int64) corev1.ResourceList {
	return corev1.ResourceList{driverName + "/vgpu": *resource.NewQuantity(n, resource.DecimalSI)}
}
