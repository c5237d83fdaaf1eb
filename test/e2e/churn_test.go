//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestChurnAcrossPluginRestarts: vGPU pods are created, used and deleted, several at a time,
// while the plugin pod is deleted (SIGTERM) and while a helm upgrade rolls it; containerd's
// own view is inspected throughout. No vGPU container may ever run without its per-container
// mounts and identity, or with another container's (before the plugin drained NRI on
// shutdown, 1 of 57 annotated pods did during a helm upgrade: containerd's NRI 0.12.3 creates
// the container when the plugin's connection closes under the request), every pod must end up
// running, and the library in each must register and allocate within its claim.
func TestChurnAcrossPluginRestarts(t *testing.T) {
	ensureNamespace(t)
	installChart(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	var (
		mu       sync.Mutex
		started  []time.Duration
		failures []string
	)
	watch := watchContainers(ctx)

	const workers = 3
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				name := fmt.Sprintf("churn-%d-%d", w, i)
				took, err := churnOnce(t, name)
				mu.Lock()
				if err != nil {
					failures = append(failures, fmt.Sprintf("%s: %v", name, err))
				} else {
					started = append(started, took)
				}
				mu.Unlock()
			}
		})
	}
	waitChurned := func(n int) {
		eventually(t, 5*time.Minute, fmt.Sprintf("%d churned pods", n), func() (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			return len(started) >= n, fmt.Errorf("%d so far, failures %v", len(started), failures)
		})
	}
	waitChurned(workers)

	// The plugin pod deleted as a node drain or an operator would: SIGTERM, graceful.
	pods, err := kube.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("plugin pods: %v %v", pods, err)
	}
	if err := kube.CoreV1().Pods(pluginNS).Delete(ctx, pods.Items[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "kubectl", "-n", pluginNS, "rollout", "status", "daemonset/"+release+"-kubelet-plugin", "--timeout=3m")
	mu.Lock()
	before := len(started)
	mu.Unlock()
	waitChurned(before + workers)

	// A helm upgrade that changes the pod template rolls the DaemonSet.
	installChart(t, "--set", "logging.verbosity=3")
	mu.Lock()
	before = len(started)
	mu.Unlock()
	waitChurned(before + workers)

	stop()
	wg.Wait()
	checks := watch.report(t)
	installChart(t) // back to the suite's settings

	var longest time.Duration
	for _, d := range started {
		longest = max(longest, d)
	}
	t.Logf("churn: %d pods started and used (longest to Running %v), %d runtime inspections, %d failures", len(started), longest.Round(time.Millisecond), checks, len(failures))
	for _, f := range failures {
		t.Errorf("churned pod: %s", f)
	}
}

// churnOnce creates a claim and a pod, waits until the pod runs, has the library allocate
// inside the claim, and deletes both. It returns how long the pod took to run.
func churnOnce(t *testing.T, name string) (time.Duration, error) {
	ctx := context.Background()
	if _, err := kube.ResourceV1().ResourceClaims(testNS).Create(ctx, claimFor(name, "1Gi", 5), metav1.CreateOptions{}); err != nil {
		return 0, fmt.Errorf("create claim: %w", err)
	}
	defer func() {
		_ = kube.CoreV1().Pods(testNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)})
		for range 600 {
			if _, err := kube.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = kube.ResourceV1().ResourceClaims(testNS).Delete(ctx, name, metav1.DeleteOptions{})
	}()
	start := time.Now()
	if _, err := kube.CoreV1().Pods(testNS).Create(ctx, vgpuPod(name, name), metav1.CreateOptions{}); err != nil {
		return 0, fmt.Errorf("create pod: %w", err)
	}
	deadline := start.Add(3 * time.Minute)
	for {
		p, err := kube.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			break
		}
		if err == nil && p.Status.Phase == corev1.PodFailed {
			return 0, fmt.Errorf("pod failed: %+v", p.Status)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("not running after 3m (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(start)
	out, err := run(t, "kubectl", "exec", "-n", testNS, name, "-c", "app", "--", "sh", "-c",
		`FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe alloc 256 1024 2>&1`)
	if err != nil || !strings.Contains(out, "alloc 256 MiB = 0") || !strings.Contains(out, "alloc 1024 MiB = 2") {
		return took, fmt.Errorf("the library in the pod: %v: %s", err, out)
	}
	return took, nil
}
