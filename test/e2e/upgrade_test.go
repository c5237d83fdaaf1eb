//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// nextPluginImageTag is the tag of the plugin image built a second time (hack/images.sh
// plugin-next): what the upgrade rolls to.
const nextPluginImageTag = "next"

// TestUpgradeWithoutGap is issue 17 on the real cluster: while vGPU pods are created, used
// (libvgpu.so registers and allocates in each) and deleted, three at a time, `helm upgrade`
// changes the plugin's image to a rebuilt one, and then `helm rollback` returns to the first.
// The chart rolls with maxSurge 1: each time the new plugin pod takes the node over from the
// old one (contract §14). Checked throughout: no pod fails or needs a second attempt (no
// Warning event — a failed Prepare or container creation, a back-off), no vGPU container runs
// without its per-container mounts or with one twice, every library registers. The pods' start
// latencies before and during the rollouts and the handovers' pauses (the plugin's own
// vgpu_dra_handover_pause_seconds) are logged: docs/performance.md.
func TestUpgradeWithoutGap(t *testing.T) {
	ensureNamespace(t)
	installChart(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	since := metav1.Now()

	var (
		mu        sync.Mutex
		phase     = "before"
		latencies = map[string][]time.Duration{}
		failures  []string
	)
	watch := watchContainers(ctx)
	const workers = 3
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				mu.Lock()
				p := phase
				mu.Unlock()
				name := fmt.Sprintf("upgrade-%d-%d", w, i)
				took, err := churnOnce(t, name)
				mu.Lock()
				if err != nil {
					failures = append(failures, fmt.Sprintf("%s (%s): %v", name, p, err))
				} else {
					latencies[p] = append(latencies[p], took)
				}
				mu.Unlock()
			}
		})
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, l := range latencies {
			n += len(l)
		}
		return n + len(failures)
	}
	waitMore := func(n int) {
		want := count() + n
		eventually(t, 5*time.Minute, fmt.Sprintf("%d churned pods", want), func() (bool, error) { return count() >= want, nil })
	}
	setPhase := func(p string) {
		mu.Lock()
		phase = p
		mu.Unlock()
	}
	waitMore(2 * workers)

	// The upgrade: a new image tag. helm --wait returns once the DaemonSet is rolled: with
	// maxUnavailable 0 that is when the new pod is Ready, i.e. owns the node.
	setPhase("upgrade")
	rev := helmRevision(t)
	oldPod := livePluginPod(t)
	installChart(t, "--set", "image.tag="+nextPluginImageTag)
	waitPluginRolled(t, oldPod)
	waitMore(workers)
	setPhase("after-upgrade")
	waitMore(workers)
	upgradePause := pluginMetric(t, "vgpu_dra_handover_pause_seconds")

	setPhase("rollback")
	oldPod = livePluginPod(t)
	mustRun(t, "helm", "rollback", release, strconv.Itoa(rev), "--namespace", pluginNS, "--wait", "--timeout", "3m")
	waitPluginRolled(t, oldPod)
	waitMore(workers)
	setPhase("after-rollback")
	waitMore(workers)
	rollbackPause := pluginMetric(t, "vgpu_dra_handover_pause_seconds")

	stop()
	wg.Wait()
	watch.report(t)
	if img := pluginImage(t); strings.HasSuffix(img, ":"+nextPluginImageTag) {
		t.Errorf("after the rollback the plugin runs %s, want the first tag", img)
	}

	for _, p := range []string{"before", "upgrade", "after-upgrade", "rollback", "after-rollback"} {
		l := latencies[p]
		slices.Sort(l)
		if len(l) > 0 {
			t.Logf("pod start latency %-14s n=%2d p50 %v max %v", p, len(l), l[len(l)/2].Round(10*time.Millisecond), l[len(l)-1].Round(10*time.Millisecond))
		}
	}
	t.Logf("handover pause (the new plugin pod's vgpu_dra_handover_pause_seconds): upgrade %s, rollback %s", upgradePause, rollbackPause)
	for _, f := range failures {
		t.Errorf("churned pod: %s", f)
	}
	// A Prepare or CreateContainer that failed shows as a kubelet's Warning event of its pod
	// (FailedPrepareDynamicResources, Failed, BackOff: the kubelet then retries after a back-off):
	// there must be none.
	events, err := kube.CoreV1().Events(testNS).List(context.Background(), metav1.ListOptions{FieldSelector: "type=Warning"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		fromKubelet := e.Source.Component == "kubelet" || e.ReportingController == "kubelet"
		if e.Reason == "MissingClusterDNS" {
			continue // the local cluster runs no DNS: every pod gets this one
		}
		when := e.LastTimestamp.Time
		if when.IsZero() {
			when = e.EventTime.Time
		}
		if fromKubelet && strings.HasPrefix(e.InvolvedObject.Name, "upgrade-") && !when.Before(since.Time) {
			t.Errorf("pod %s: %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
}

// helmRevision is the release's current revision.
func helmRevision(t *testing.T) int {
	t.Helper()
	out := mustRun(t, "helm", "status", release, "--namespace", pluginNS, "-o", "json")
	i := strings.Index(out, `"version":`)
	if i < 0 {
		t.Fatalf("helm status: no version in %s", out)
	}
	rest := out[i+len(`"version":`):]
	n, err := strconv.Atoi(strings.TrimSpace(rest[:strings.IndexAny(rest, ",}")]))
	if err != nil {
		t.Fatalf("helm status version: %v", err)
	}
	return n
}

// livePluginPod is the one kubelet-plugin pod that is not terminating.
func livePluginPod(t *testing.T) corev1.Pod {
	t.Helper()
	var live corev1.Pod
	eventually(t, defaultTimeout, "exactly one live kubelet-plugin pod", func() (bool, error) {
		pods, err := kube.CoreV1().Pods(pluginNS).List(context.Background(), metav1.ListOptions{LabelSelector: pluginSelector})
		if err != nil {
			return false, err
		}
		var all []corev1.Pod
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				all = append(all, p)
			}
		}
		if len(all) != 1 {
			return false, fmt.Errorf("%d live kubelet-plugin pods", len(all))
		}
		live = all[0]
		return true, nil
	})
	return live
}

// waitPluginRolled waits until the old plugin pod is gone and one new one is Ready.
func waitPluginRolled(t *testing.T, old corev1.Pod) {
	t.Helper()
	eventually(t, 3*time.Minute, "the old plugin pod gone and a new one Ready", func() (bool, error) {
		pods, err := kube.CoreV1().Pods(pluginNS).List(context.Background(), metav1.ListOptions{LabelSelector: pluginSelector})
		if err != nil {
			return false, err
		}
		if len(pods.Items) != 1 || pods.Items[0].UID == old.UID || !podReady(&pods.Items[0]) {
			return false, fmt.Errorf("%d plugin pods", len(pods.Items))
		}
		return true, nil
	})
}

// pluginImage is the image of the live plugin pod.
func pluginImage(t *testing.T) string {
	p := livePluginPod(t)
	return p.Spec.Containers[0].Image
}

// pluginMetric reads a histogram's samples from the live plugin pod's /metrics:
// "count n, sum s".
func pluginMetric(t *testing.T, name string) string {
	t.Helper()
	p := livePluginPod(t)
	body, err := scraper.Get(context.Background(), net.JoinHostPort(p.Status.PodIP, "8080"))
	if err != nil {
		t.Errorf("plugin metrics: %v", err)
		return "?"
	}
	var count, sum string
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, name+"_count "):
			count = strings.TrimPrefix(line, name+"_count ")
		case strings.HasPrefix(line, name+"_sum "):
			sum = strings.TrimPrefix(line, name+"_sum ")
		}
	}
	if count == "" {
		t.Errorf("the plugin's /metrics has no %s", name)
		return "?"
	}
	if count != "1" {
		t.Errorf("%s has %s samples in the new plugin pod, want 1 (one handover to it)", name, count)
	}
	return fmt.Sprintf("%ss (%s handover)", sum, count)
}
