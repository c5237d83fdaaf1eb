//go:build e2e

// Package e2e runs vgpu-dra on a real single-node cluster (hack/cluster-up.sh): etcd, the
// control plane and the kubelet built from the Kubernetes modules, containerd with NRI and
// CDI, the chart installed with helm, pods from locally assembled images. `make e2e` brings
// the cluster up, runs this suite and tears the cluster down. GPUs are simulated (go-nvml
// mocks in the plugin); everything else is real.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	driverName  = "vgpu.dra.dev"
	pluginNS    = "vgpu-dra"
	release     = "vgpu-dra"
	webhookName = release + "-webhook"
	// Label selectors of the plugin's and the webhook's pods, which share the namespace.
	pluginSelector  = "app.kubernetes.io/component=kubelet-plugin"
	webhookSelector = "app.kubernetes.io/component=webhook"
	// requiredPlugins is the annotation the webhook gives a container named app (contract §1).
	requiredPlugins = "required-plugins.noderesource.dev/container.app"
	testNS          = "vgpu-e2e"
	workloadImage   = "docker.io/vgpu-dra/test-workload:dev"
	pollInterval    = 250 * time.Millisecond
	defaultTimeout  = 2 * time.Minute
)

var (
	repoRoot string
	binDir   string // _output/cluster/bin: kubectl, helm
	kube     kubernetes.Interface
	// restConfig is the admin kubeconfig's, without client-side rate limits (benchmarks).
	restConfig *rest.Config
)

func TestMain(m *testing.M) {
	wd, _ := os.Getwd()
	repoRoot = filepath.Clean(filepath.Join(wd, "..", ".."))
	binDir = filepath.Join(repoRoot, "_output", "cluster", "bin")
	kc := os.Getenv("KUBECONFIG")
	if kc == "" {
		fmt.Fprintln(os.Stderr, "e2e: KUBECONFIG is not set; run the suite with `make e2e` (it brings the cluster up)")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(2)
	}
	restConfig = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 50, 100
	if kube, err = kubernetes.NewForConfig(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// run executes one of the cluster's tools and returns its combined output.
func run(t testing.TB, tool string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, tool), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func mustRun(t testing.TB, tool string, args ...string) string {
	t.Helper()
	out, err := run(t, tool, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
	}
	return out
}

// installChart installs (or upgrades) the chart with simulated GPUs and waits for the plugin
// and the webhook.
func installChart(t testing.TB, extra ...string) {
	t.Helper()
	installChartFor(t, "kubelet-plugin", extra...)
}

// installChartFor is installChart for the plugin DaemonSet <release>-<daemonset> that the
// values install ("kubelet-plugin" or "device-plugin").
func installChartFor(t testing.TB, daemonset string, extra ...string) {
	t.Helper()
	args := append([]string{"upgrade", "--install", release, filepath.Join(repoRoot, "deployments/helm/vgpu-dra"),
		"--namespace", pluginNS, "--create-namespace", "--wait", "--timeout", "3m",
		"--set", "deviceSource=simulated:dgx-h200:1", "--set", "gpuInjection=none", "--set", "gpuCDIKind=",
		"--set", "image.pullPolicy=Never", "--set", "logging.verbosity=4"}, extra...)
	mustRun(t, "helm", args...)
	// helm --wait counts a DaemonSet ready when (desired - maxUnavailable) pods are: with one
	// node and maxUnavailable 1 that is none. Wait for the plugin pod itself; its startup probe
	// passes only once the kubelet has registered the driver, so a claim prepared after this
	// does not fail with "driver not registered" (and then sit in the kubelet's backoff).
	mustRun(t, "kubectl", "-n", pluginNS, "rollout", "status", "daemonset/"+release+"-"+daemonset, "--timeout=2m")
	waitWebhookSettled(t)
}

// waitWebhookSettled waits until every webhook pod is of the Deployment's current template and
// Ready, and none of an older one is left. helm --wait and `rollout status` return while old
// pods still drain (they keep answering for --shutdown-delay), and an upgrade that changes what
// the webhook does (NRISupport) must not have its first pods reviewed by the old flags.
func waitWebhookSettled(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 3*time.Minute, "the webhook's pods to be the current ones, all Ready", func() (bool, error) {
		d, err := kube.AppsV1().Deployments(pluginNS).Get(ctx, webhookName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pods, err := kube.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{LabelSelector: webhookSelector})
		if err != nil {
			return false, err
		}
		if d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas != *d.Spec.Replicas || len(pods.Items) != int(*d.Spec.Replicas) {
			return false, fmt.Errorf("deployment %+v, %d pods", d.Status, len(pods.Items))
		}
		hashes := map[string]bool{}
		for _, p := range pods.Items {
			hashes[p.Labels["pod-template-hash"]] = true
			if p.DeletionTimestamp != nil || !podReady(&p) {
				return false, fmt.Errorf("pod %s terminating or not Ready", p.Name)
			}
		}
		return len(hashes) == 1, fmt.Errorf("pods of %d templates", len(hashes))
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// eventually polls cond until it returns true or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		time.Sleep(pollInterval)
	}
	t.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, lastErr)
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
	req := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: driverName,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(memory), "cores": *resource.NewQuantity(cores, resource.DecimalSI),
		}},
	}}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}},
	}
}

// vgpuPod runs the test workload with the claim. It carries no annotation: the webhook adds
// the required-plugins annotation (contract §1, §12).
func vgpuPod(name, claim string, command ...string) *corev1.Pod {
	if len(command) == 0 {
		command = []string{"sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"}
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptrTo[int64](1),
			RestartPolicy:                 corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "app", Image: workloadImage, ImagePullPolicy: corev1.PullNever, Command: command,
			}},
		},
	}
	if claim != "" {
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
	}
	return p
}

func ptrTo[T any](v T) *T { return &v }

func createClaim(t testing.TB, c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	t.Helper()
	out, err := kube.ResourceV1().ResourceClaims(testNS).Create(context.Background(), c, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim %s: %v", c.Name, err)
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
	cmd := exec.Command(filepath.Join(repoRoot, script), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	return string(out)
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
