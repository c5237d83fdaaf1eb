//go:build e2e

// Package e2e runs vgpu-dra on a real single-node cluster (hack/cluster-up.sh): etcd, the
// control plane and the kubelet built from the Kubernetes modules, containerd with NRI and
// CDI, the chart installed with helm, pods from locally assembled images. `make e2e` brings
// the cluster up, runs this suite and tears the cluster down. GPUs are simulated (go-nvml
// mocks in the plugin); everything else is real. What the chaos suite shares with it lives in
// test/cluster.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

const (
	driverName  = cluster.DriverName
	pluginNS    = cluster.PluginNS
	release     = cluster.Release
	webhookName = cluster.WebhookName
	// Label selectors of the plugin's and the webhook's pods, which share the namespace.
	pluginSelector  = cluster.PluginSelector
	webhookSelector = cluster.WebhookSelector
	// requiredPlugins is the annotation the webhook gives a container named app (contract §1).
	requiredPlugins = "required-plugins.noderesource.dev/container.app"
	testNS          = "vgpu-e2e"
	workloadImage   = cluster.WorkloadImage
	defaultTimeout  = 2 * time.Minute
)

var (
	c        *cluster.Cluster
	kube     kubernetes.Interface
	repoRoot string
	binDir   string // _output/cluster/bin: kubectl, helm
	// restConfig is the admin kubeconfig's, without client-side rate limits (benchmarks).
	restConfig *rest.Config
	// scraper reads the binaries' /metrics (HTTPS, a token allowed to get /metrics) as the
	// Prometheus the chart's metrics.readers binds would.
	scraper *cluster.MetricsScraper
)

func TestMain(m *testing.M) {
	var err error
	if c, err = cluster.Connect(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(2)
	}
	kube, repoRoot, binDir, restConfig = c.Kube, c.RepoRoot, c.BinDir, c.RestConfig
	scraper = c.MetricsScraper()
	code := m.Run()
	if code == 0 {
		if err := c.CheckNoFalsePositives(misbehaving); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: false positives of the node-side enforcer:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// run executes one of the cluster's tools and returns its combined output.
func run(t testing.TB, tool string, args ...string) (string, error) {
	t.Helper()
	return c.Run(tool, args...)
}

func mustRun(t testing.TB, tool string, args ...string) string {
	t.Helper()
	return c.MustRun(t, tool, args...)
}

// installChart installs (or upgrades) the chart with simulated GPUs and waits for the plugin
// and the webhook.
func installChart(t testing.TB, extra ...string) {
	t.Helper()
	c.InstallChart(t, extra...)
}

// installChartFor is installChart for the plugin DaemonSet <release>-<daemonset> that the
// values install ("kubelet-plugin" or "device-plugin").
func installChartFor(t testing.TB, daemonset string, extra ...string) {
	t.Helper()
	c.InstallChartFor(t, daemonset, extra...)
}

// waitWebhookSettled waits until the webhook's pods are all current and Ready.
func waitWebhookSettled(t testing.TB) {
	t.Helper()
	c.WaitWebhookSettled(t)
}

func podReady(p *corev1.Pod) bool { return cluster.PodReady(p) }

// eventually polls cond until it returns true or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	cluster.Eventually(t, timeout, what, cond)
}

func ensureNamespace(t testing.TB) {
	t.Helper()
	_, err := kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// claimFor is a ResourceClaim for a share of one vGPU.
func claimFor(name, memory string, cores int64) *resourceapi.ResourceClaim {
	return cluster.ClaimFor(testNS, name, memory, cores)
}

// vgpuPod runs the test workload with the claim. It carries no annotation: the webhook adds
// the required-plugins annotation (contract §1, §12).
func vgpuPod(name, claim string, command ...string) *corev1.Pod {
	return cluster.VGPUPod(testNS, name, claim, command...)
}

func ptrTo[T any](v T) *T { return &v }

func createClaim(t testing.TB, cl *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	t.Helper()
	out, err := kube.ResourceV1().ResourceClaims(testNS).Create(context.Background(), cl, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim %s: %v", cl.Name, err)
	}
	return out
}

func createPod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := kube.CoreV1().Pods(testNS).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
}

func waitRunning(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	return waitRunningWithin(t, name, defaultTimeout)
}

// waitRunningWithin is waitRunning with its own limit.
func waitRunningWithin(t *testing.T, name string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	return waitRunningIn(t, testNS, name, timeout)
}

// waitRunningIn waits for a pod of any namespace to be Running, and fails if it fails.
func waitRunningIn(t *testing.T, ns, name string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, timeout, "pod "+ns+"/"+name+" Running", func() (bool, error) {
		var err error
		pod, err = kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if pod.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod %s failed: %+v", name, pod.Status)
		}
		return pod.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s %v", pod.Status.Phase, pod.Status.ContainerStatuses)
	})
	return pod
}

func deletePod(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	if err := kube.CoreV1().Pods(testNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	eventually(t, defaultTimeout, "pod "+name+" gone", func() (bool, error) {
		_, err := kube.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
}

// execIn runs a shell command in the pod's app container.
func execIn(t *testing.T, pod, script string) string {
	t.Helper()
	return mustRun(t, "kubectl", "exec", "-n", testNS, pod, "-c", "app", "--", "sh", "-c", script)
}

// envOf returns the container's environment as its processes see it.
func envOf(t *testing.T, pod string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(execIn(t, pod, "env"), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out
}

// mountsOf returns mount point → options of the container's mounts.
func mountsOf(t *testing.T, pod string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(execIn(t, pod, "cat /proc/self/mounts"), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 {
			out[f[1]] = f[3]
		}
	}
	return out
}

func filepathGlob(pattern string) ([]string, error) { return filepath.Glob(pattern) }

// mustRunScript runs one of the repository's hack scripts (fault injection).
func mustRunScript(t *testing.T, script string, args ...string) string {
	t.Helper()
	out, err := c.Script(script, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return out
}

// probeOutput is vgpu_probe's output without its "pid N" line (which differs per run).
func probeOutput(out string) string {
	var keep []string
	for _, line := range strings.SplitAfter(out, "\n") {
		if !strings.HasPrefix(line, "pid ") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "")
}
