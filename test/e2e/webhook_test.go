//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestWebhook walks the admission webhook's scenarios (issue 11) on a fresh install, after
// TestVGPU has uninstalled: the examples annotated, the extended resource, every refusal, a
// certificate rotation forced while pods are created, the webhook's pods deleted, uninstall.
func TestWebhook(t *testing.T) {
	ctx := context.Background()
	installChart(t)
	ensureNamespace(t)

	t.Run("1-examples-get-the-annotation", func(t *testing.T) {
		example := filepath.Join(repoRoot, "deployments/examples/shared-gpu.yaml")
		// One file, a template and the pods that use it: the webhook sees each pod milliseconds
		// after the template, and waits for its cache rather than refusing.
		mustRun(t, "kubectl", "apply", "-f", example)
		defer mustRun(t, "kubectl", "delete", "-f", example, "--wait", "--timeout=2m")
		for _, name := range []string{"share-a", "share-b"} {
			pod := waitRunningIn(t, "default", name, defaultTimeout)
			if got := pod.Annotations[requiredPlugins]; got != `["`+driverName+`"]` {
				t.Errorf("%s: annotation %q, want the webhook's", name, got)
			}
			env := mustRun(t, "kubectl", "exec", "-n", "default", name, "--", "env")
			for _, want := range []string{"CUDA_MEM_LIMIT_0=10240m", "CUDA_CORE_LIMIT_0=30", "VGPU_CONTAINER_NAME=app"} {
				if !strings.Contains(env, want+"\n") {
					t.Errorf("%s: env lacks %s:\n%s", name, want, env)
				}
			}
		}
	})

	t.Run("2-extended-resource", func(t *testing.T) {
		p := vgpuPod("ext", "")
		p.Spec.Containers[0].Resources.Limits = extendedResourceLimits(1)
		created, err := kube.CoreV1().Pods(testNS).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := created.Annotations[requiredPlugins]; got != `["`+driverName+`"]` {
			t.Errorf("annotation %q, want the webhook's", got)
		}
		// The examples' claims go with their pods; the whole GPU is free once they are unprepared.
		pod := waitRunningWithin(t, "ext", 3*time.Minute)
		if pod.Status.ExtendedResourceClaimStatus == nil {
			t.Fatalf("no extended resource claim in the pod's status: %+v", pod.Status)
		}
		claim, err := kube.ResourceV1().ResourceClaims(testNS).Get(ctx, pod.Status.ExtendedResourceClaimStatus.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		env := envOf(t, "ext")
		if env["MANAGER_VGPU_CLAIM_UID"] != string(claim.UID) || !strings.HasPrefix(env["MANAGER_VISIBLE_DEVICE_0"], "GPU-") || env["VGPU_POD_UID"] != string(pod.UID) {
			t.Errorf("env of the extended resource's container: %v (claim %s)", env, claim.UID)
		}
		// A whole GPU: both limits written empty, i.e. unlimited (contract §3).
		for _, k := range []string{"CUDA_MEM_LIMIT_0", "CUDA_CORE_LIMIT_0"} {
			if v, ok := env[k]; !ok || v != "" {
				t.Errorf("%s=%q (set: %v), want empty: the claim is a whole GPU", k, v, ok)
			}
		}
		if out := execIn(t, "ext", "vgpu-registry-client"); !strings.Contains(out, "status: OK") {
			t.Errorf("registration: %s", out)
		}
		deletePod(t, "ext")
	})

	t.Run("3-refusals-and-an-unchanged-valid-pod", func(t *testing.T) {
		for _, c := range []*resourceapi.ResourceClaim{claimFor("r1", "1Gi", 10), claimFor("r2", "1Gi", 10),
			pairClaim("pair", false), pairClaim("pair-distinct", true)} {
			createClaim(t, c)
		}
		for _, tt := range refusals() {
			out, err := kubectlApply(t, tt.manifest)
			if err == nil {
				t.Errorf("%s: admitted:\n%s", tt.name, out)
				continue
			}
			for _, want := range append([]string{"denied the request"}, tt.want...) {
				if !strings.Contains(out, want) {
					t.Errorf("%s: kubectl says %q, which lacks %q", tt.name, out, want)
				}
			}
			t.Logf("%s: %s", tt.name, strings.TrimSpace(out))
		}

		// Admitted, the same pod in a namespace the webhook never sees and in ours differ in the
		// annotation only.
		valid := vgpuPod("valid", "r1")
		valid.Spec.AutomountServiceAccountToken = ptrTo(false) // no generated token volume to differ
		ours, err := dryRunCreate(ctx, testNS, valid)
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := dryRunCreate(ctx, "kube-system", valid)
		if err != nil {
			t.Fatal(err)
		}
		if !apiequality.Semantic.DeepEqual(ours.Spec, theirs.Spec) {
			t.Errorf("the webhook changed the pod's spec:\nours   %+v\ntheirs %+v", ours.Spec, theirs.Spec)
		}
		if len(theirs.Annotations) != 0 || len(ours.Annotations) != 1 || ours.Annotations[requiredPlugins] != `["`+driverName+`"]` {
			t.Errorf("annotations: ours %v, without the webhook %v", ours.Annotations, theirs.Annotations)
		}

		// Two requests under the constraint the refusal asks for: admitted.
		if p, err := dryRunCreate(ctx, testNS, vgpuPod("pair-distinct", "pair-distinct")); err != nil || p.Annotations[requiredPlugins] == "" {
			t.Errorf("a pod whose two requests are under distinctAttribute: %v", err)
		}

		metrics := webhookMetrics(t)
		for _, want := range []string{`decision="denied",kind="Pod",webhook="validating"`, `decision="denied",kind="ResourceClaim"`,
			`decision="denied",kind="Pod",webhook="mutating"`, `decision="patched",kind="Pod",webhook="mutating"`,
			`webhook_denials_total{reason="two_claims"}`, `webhook_denials_total{reason="missing_claim"}`,
			`vgpu_dra_webhook_admission_duration_seconds_bucket`, `rest_client_requests_total{code="200"`} {
			if !strings.Contains(metrics, want) {
				t.Errorf("the webhooks' /metrics lack %s", want)
			}
		}
	})

	t.Run("4-certificate-rotation-while-creating-pods", func(t *testing.T) {
		roots, bundle := webhookCA(t)
		before := servedCerts(t, roots)
		load := startAdmissions(ctx, t)
		// Forced the way an operator would: the serving certificate taken out of its Secret.
		// The rotator issues a new one under the same CA; each replica loads it at once.
		secret := kube.CoreV1().Secrets(pluginNS)
		if _, err := secret.Patch(ctx, webhookName+"-tls", types.JSONPatchType, []byte(`[{"op":"remove","path":"/data/tls.crt"}]`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 2*time.Minute, "every replica to serve a new certificate under the same CA", func() (bool, error) {
			after := servedCerts(t, roots)
			for pod, cert := range after {
				if cert == before[pod] || strings.HasPrefix(cert, "error") {
					return false, fmt.Errorf("%s serves %s (before: %s)", pod, cert, before[pod])
				}
			}
			return len(after) == len(before), fmt.Errorf("replicas %v, before %v", after, before)
		})
		load.waitMore(t, 20)
		stats := load.stop()
		t.Logf("admissions during the rotation: %+v", stats)
		if stats.vgpuFailed+stats.plainFailed > 0 || stats.vgpuAnnotated == 0 {
			t.Errorf("admissions failed during the rotation: %+v", stats)
		}
		if _, after := webhookCA(t); after != bundle {
			t.Errorf("the caBundle changed: a renewed serving certificate must keep its CA")
		}
	})

	t.Run("5-webhook-pods-deleted", func(t *testing.T) {
		// Deleted while pods are created: a vGPU pod is admitted with its annotation or refused,
		// never admitted without it; other pods are admitted throughout.
		load := startAdmissions(ctx, t)
		pods, err := kube.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{LabelSelector: webhookSelector})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if err := kube.CoreV1().Pods(pluginNS).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		waitWebhookSettled(t)
		load.waitMore(t, 10)
		stats := load.stop()
		t.Logf("admissions while the webhook's pods were replaced: %+v", stats)
		if stats.vgpuUnguarded+stats.plainFailed+stats.vgpuFailed > 0 {
			t.Errorf("%+v: every vGPU pod must be annotated or refused, every other one admitted", stats)
		}

		// None at all: refused, with the webhook named, until it is back.
		mustRun(t, "kubectl", "-n", pluginNS, "scale", "deployment/"+webhookName, "--replicas=0")
		eventually(t, defaultTimeout, "no webhook pod left", func() (bool, error) {
			list, err := kube.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{LabelSelector: webhookSelector})
			return err == nil && len(list.Items) == 0, err
		})
		_, err = dryRunCreate(ctx, testNS, vgpuPod("while-gone", "r1"))
		if err == nil || !strings.Contains(err.Error(), `failed calling webhook "required-plugins.`+driverName+`"`) {
			t.Errorf("a vGPU pod without the webhook: %v, want a refusal that names the webhook", err)
		}
		t.Logf("vGPU pod without the webhook: %v", err)
		_, err = kube.ResourceV1().ResourceClaims(testNS).Create(ctx, claimFor("while-gone", "1Gi", 10), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), `failed calling webhook "resourceclaims.`+driverName+`"`) {
			t.Errorf("a vGPU claim without the webhook: %v", err)
		}
		if _, err := dryRunCreate(ctx, testNS, vgpuPod("plain", "")); err != nil {
			t.Errorf("a pod without a vGPU, webhook gone: %v", err)
		}
		other := claimFor("other", "1Gi", 10)
		other.Spec.Devices.Requests[0].Exactly.DeviceClassName = "other.example.com"
		if _, err := kube.ResourceV1().ResourceClaims(testNS).Create(ctx, other, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("a claim of another class, webhook gone: %v", err)
		}
		mustRun(t, "kubectl", "-n", pluginNS, "scale", "deployment/"+webhookName, "--replicas=2")
		waitWebhookSettled(t)
		if p, err := dryRunCreate(ctx, testNS, vgpuPod("back", "r1")); err != nil || p.Annotations[requiredPlugins] == "" {
			t.Errorf("a vGPU pod once the webhook is back: %v, %v", err, p)
		}
	})

	t.Run("6-uninstall-removes-the-webhook", func(t *testing.T) {
		for _, c := range []string{"r1", "r2", "pair", "pair-distinct"} {
			_ = kube.ResourceV1().ResourceClaims(testNS).Delete(ctx, c, metav1.DeleteOptions{})
		}
		mustRun(t, "helm", "uninstall", release, "--namespace", pluginNS, "--wait", "--timeout", "2m")
		if _, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, webhookName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("MutatingWebhookConfiguration after uninstall: %v", err)
		}
		if _, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhookName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("ValidatingWebhookConfiguration after uninstall: %v", err)
		}
		if _, err := kube.CoreV1().Secrets(pluginNS).Get(ctx, webhookName+"-tls", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("TLS Secret after uninstall: %v", err)
		}
		eventually(t, defaultTimeout, "the release's pods gone", func() (bool, error) {
			list, err := kube.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{})
			return err == nil && len(list.Items) == 0, err
		})
	})
}

// admissionStats counts what startAdmissions saw.
type admissionStats struct {
	vgpuAnnotated int // vGPU pods admitted with the annotation
	vgpuRefused   int // refused because the webhook did not answer
	vgpuUnguarded int // admitted without the annotation: must never happen
	vgpuFailed    int // refused for any other reason
	plainAdmitted int
	plainFailed   int
	errs          []string
}

// admissionLoad creates (dry run) a vGPU pod and a pod without one, over and over, until stopped.
type admissionLoad struct {
	mu    sync.Mutex
	stats admissionStats
	done  chan struct{}
	wg    sync.WaitGroup
}

// startAdmissions starts the load; the vGPU pods use claim r1 (scenario 3).
func startAdmissions(ctx context.Context, t *testing.T) *admissionLoad {
	l := &admissionLoad{done: make(chan struct{})}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for i := 0; ; i++ {
			select {
			case <-l.done:
				return
			default:
			}
			p, err := dryRunCreate(ctx, testNS, vgpuPod(fmt.Sprintf("load-%d", i), "r1"))
			_, plainErr := dryRunCreate(ctx, testNS, vgpuPod(fmt.Sprintf("plain-%d", i), ""))
			l.mu.Lock()
			switch {
			case err == nil && p.Annotations[requiredPlugins] != "":
				l.stats.vgpuAnnotated++
			case err == nil:
				l.stats.vgpuUnguarded++
			case strings.Contains(err.Error(), "failed calling webhook"):
				l.stats.vgpuRefused++
			default:
				l.stats.vgpuFailed++
				l.stats.errs = append(l.stats.errs, err.Error())
			}
			if plainErr == nil {
				l.stats.plainAdmitted++
			} else {
				l.stats.plainFailed++
				l.stats.errs = append(l.stats.errs, plainErr.Error())
			}
			l.mu.Unlock()
		}
	}()
	return l
}

// waitMore waits until n more vGPU pods have been admitted with their annotation.
func (l *admissionLoad) waitMore(t *testing.T, n int) {
	t.Helper()
	l.mu.Lock()
	target := l.stats.vgpuAnnotated + n
	l.mu.Unlock()
	eventually(t, defaultTimeout, fmt.Sprintf("%d more vGPU pods admitted", n), func() (bool, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.stats.vgpuAnnotated >= target, fmt.Errorf("%+v", l.stats)
	})
}

func (l *admissionLoad) stop() admissionStats {
	close(l.done)
	l.wg.Wait()
	return l.stats
}
