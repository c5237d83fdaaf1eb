// Package cluster is what the cluster suites — test/e2e (build tag e2e) and test/chaos (build
// tag chaos) — share about the local single-node cluster that hack/cluster-up.sh starts: the API
// client, the cluster's own tools, the chart, vGPU claims and pods, and containerd's own view of
// the running containers with the invariant every suite checks on it (contract §4).
//
// The suites exercise it against the cluster; its own test covers the invariant's logic.
package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Names the chart and the suites use (contract §1; deployments/helm/vgpu-dra).
const (
	DriverName  = "vgpu.dra.dev"
	PluginNS    = "vgpu-dra"
	Release     = "vgpu-dra"
	PluginDS    = Release + "-kubelet-plugin"
	WebhookName = Release + "-webhook"
	// Label selectors of the plugin's and the webhook's pods, which share the namespace.
	PluginSelector  = "app.kubernetes.io/component=kubelet-plugin"
	WebhookSelector = "app.kubernetes.io/component=webhook"
	WorkloadImage   = "docker.io/vgpu-dra/test-workload:dev"
	// StateDir is the chart's default state dir (--state-dir) on the host.
	StateDir = "/var/lib/vgpu-dra"
	// PollInterval is how often the suites poll for a condition.
	PollInterval = 250 * time.Millisecond
)

// APITimeout bounds every request of the client Connect builds: a suite must notice an API
// server that does not answer (the chaos suite freezes it) instead of hanging.
const APITimeout = 30 * time.Second

// Cluster is the running local cluster as a suite sees it.
type Cluster struct {
	// RepoRoot is the repository's root directory.
	RepoRoot string
	// BinDir is _output/cluster/bin: kubectl, helm, ctr.
	BinDir string
	// Kube is a cluster-admin client (50 QPS, requests bounded by APITimeout).
	Kube kubernetes.Interface
	// RestConfig is the admin kubeconfig's, without client-side rate limits or a timeout
	// (benchmarks).
	RestConfig *rest.Config
}

// Connect builds the client from $KUBECONFIG (the suites' make targets set it) and finds the
// repository from the working directory.
func Connect() (*Cluster, error) {
	kc := os.Getenv("KUBECONFIG")
	if kc == "" {
		return nil, errors.New("KUBECONFIG is not set; run the suite through its make target (it brings the cluster up)")
	}
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", kc, err)
	}
	restConfig := rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 50, 100
	cfg.Timeout = APITimeout
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("build the client from %s: %w", kc, err)
	}
	return &Cluster{RepoRoot: root, BinDir: filepath.Join(root, "_output", "cluster", "bin"), Kube: kube, RestConfig: restConfig}, nil
}

// repoRoot is the nearest directory above the working directory that holds go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find the repository: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find the repository: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Run executes one of the cluster's tools (kubectl, helm, ctr) with a 4-minute limit and
// returns its combined output.
func (c *Cluster) Run(tool string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	return c.RunContext(ctx, tool, args...)
}

// RunContext is Run bounded by ctx instead.
func (c *Cluster) RunContext(ctx context.Context, tool string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, tool), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w", tool, strings.Join(args, " "), err)
	}
	return out.String(), nil
}

// MustRun is Run that fails the test on an error.
func (c *Cluster) MustRun(t testing.TB, tool string, args ...string) string {
	t.Helper()
	out, err := c.Run(tool, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return out
}

// Script runs one of the repository's scripts (hack/...: fault injection) and returns its
// combined output.
func (c *Cluster) Script(script string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(c.RepoRoot, script), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w", script, strings.Join(args, " "), err)
	}
	return string(out), nil
}

// InstallChart installs (or upgrades) the chart with one simulated H200, /metrics readable by
// MetricsScraper, the images (the plugin's, the helm test pod's WorkloadImage) never pulled, and
// waits for the plugin and the webhook.
func (c *Cluster) InstallChart(t testing.TB, extra ...string) {
	t.Helper()
	c.InstallChartFor(t, "kubelet-plugin", extra...)
}

// InstallChartFor is InstallChart for the plugin DaemonSet <release>-<daemonset> that the
// values install ("kubelet-plugin" or "device-plugin").
func (c *Cluster) InstallChartFor(t testing.TB, daemonset string, extra ...string) {
	t.Helper()
	args := append([]string{"upgrade", "--install", Release, filepath.Join(c.RepoRoot, "deployments/helm/vgpu-dra"),
		"--namespace", PluginNS, "--create-namespace", "--wait", "--timeout", "3m",
		"--set", "deviceSource=simulated:dgx-h200:1", "--set", "gpuInjection=none", "--set", "gpuCDIKind=",
		"--set", "image.pullPolicy=Never", "--set", "tests.image.pullPolicy=Never", "--set", "logging.verbosity=4",
		"--set-json", MetricsReaders}, extra...)
	c.MustRun(t, "helm", args...)
	// helm --wait counts a DaemonSet ready when (desired - maxUnavailable) pods are: with one
	// node and maxUnavailable 1 that is none. Wait for the plugin pod itself; its startup probe
	// passes only once the kubelet has registered the driver, so a claim prepared after this
	// does not fail with "driver not registered" (and then sit in the kubelet's backoff).
	c.MustRun(t, "kubectl", "-n", PluginNS, "rollout", "status", "daemonset/"+Release+"-"+daemonset, "--timeout=2m")
	c.WaitWebhookSettled(t)
}

// WaitWebhookSettled waits until every webhook pod is of the Deployment's current template and
// Ready, and none of an older one is left. helm --wait and `rollout status` return while old
// pods still drain (they keep answering for --shutdown-delay), and an upgrade that changes what
// the webhook does (NRISupport) must not have its first pods reviewed by the old flags.
func (c *Cluster) WaitWebhookSettled(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	Eventually(t, 3*time.Minute, "the webhook's pods to be the current ones, all Ready", func() (bool, error) {
		d, err := c.Kube.AppsV1().Deployments(PluginNS).Get(ctx, WebhookName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pods, err := c.Kube.CoreV1().Pods(PluginNS).List(ctx, metav1.ListOptions{LabelSelector: WebhookSelector})
		if err != nil {
			return false, err
		}
		if d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas != *d.Spec.Replicas || len(pods.Items) != int(*d.Spec.Replicas) {
			return false, fmt.Errorf("deployment %+v, %d pods", d.Status, len(pods.Items))
		}
		hashes := map[string]bool{}
		for _, p := range pods.Items {
			hashes[p.Labels["pod-template-hash"]] = true
			if p.DeletionTimestamp != nil || !PodReady(&p) {
				return false, fmt.Errorf("pod %s terminating or not Ready", p.Name)
			}
		}
		return len(hashes) == 1, fmt.Errorf("pods of %d templates", len(hashes))
	})
}

// PodReady says whether the pod's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Eventually polls cond every PollInterval until it returns true, and fails the test with the
// last error when timeout passes first.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	if err := Poll(context.Background(), timeout, cond); err != nil {
		t.Fatalf("waiting %v for %s: %v", timeout, what, err)
	}
}

// Poll polls cond every PollInterval until it returns true (nil), or ctx ends or timeout
// passes: then the error says which, with the last error cond returned.
func Poll(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
		case <-time.After(PollInterval):
		}
	}
}
