//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// hostRegistrySocket is the plugin's registry socket on this node (the chart's state dir).
const hostRegistrySocket = "/var/lib/vgpu-dra/registry/registry.sock"

// probeLoops is how many loops of vgpu_probe run at once in the pod during a restart.
const probeLoops = 3

// TestRegistryAcrossPluginRestart: libvgpu.so itself — vgpu_probe linked against the fake
// libcuda in the test-workload image, in a pod with a sized claim — registers over and over
// while the plugin pod is deleted (SIGTERM, as a rollout or an eviction does) and the
// DaemonSet brings a new one. Every probe's CUDA init must succeed: the stopping registry
// answers RETRY to what it accepted, and the library's retry budget covers the gap until the
// new plugin serves. Probes that ran while no plugin served (started then, or started before
// and still waiting when the new socket came) must be among them, or the restart was not
// covered. The restart's durations are logged: they are what the budget
// (contract §5) is chosen against.
func TestRegistryAcrossPluginRestart(t *testing.T) {
	installChart(t)
	ensureNamespace(t)
	createClaim(t, claimFor("restart-probe", "1Gi", 5))
	t.Cleanup(func() {
		deletePod(t, "restart-probe")
		_ = kube.ResourceV1().ResourceClaims(testNS).Delete(context.Background(), "restart-probe", metav1.DeleteOptions{})
	})
	createPod(t, vgpuPod("restart-probe", "restart-probe"))
	waitRunning(t, "restart-probe")
	for cycle := 1; cycle <= 2; cycle++ {
		t.Run(fmt.Sprintf("restart-%d", cycle), func(t *testing.T) { probeAcrossRestart(t, cycle) })
	}
}

// probeRun is one vgpu_probe process: when it started and ended (host uptime, seconds) and
// the first line it printed.
type probeRun struct {
	loop, index int
	start, end  float64
	result      string
}

func probeAcrossRestart(t *testing.T, cycle int) {
	ctx := context.Background()
	loops := make([]string, probeLoops)
	var wg sync.WaitGroup
	for k := range probeLoops {
		script := fmt.Sprintf(`c=%d; k=%d; i=0; rm -f /tmp/stop-$c /tmp/probe-$c-$k.log
while [ ! -e /tmp/stop-$c ]; do
  read s _ < /proc/uptime
  r=$(FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe init 2>/tmp/err-$c-$k-$i | head -n 1)
  read e _ < /proc/uptime
  echo "$k $i $s $e $r" >> /tmp/probe-$c-$k.log
  [ "$r" = "cuInit=0" ] && rm -f /tmp/err-$c-$k-$i
  i=$((i+1))
done
cat /tmp/probe-$c-$k.log`, cycle, k)
		wg.Go(func() {
			out, err := run(t, "kubectl", "exec", "-n", testNS, "restart-probe", "-c", "app", "--", "sh", "-c", script)
			if err != nil {
				out = "error: " + err.Error() + "\n" + out
			}
			loops[k] = out
		})
	}
	stopLoops := func() {
		_, _ = run(t, "kubectl", "exec", "-n", testNS, "restart-probe", "-c", "app", "--", "touch", fmt.Sprintf("/tmp/stop-%d", cycle))
		wg.Wait()
	}
	defer stopLoops()
	eventually(t, defaultTimeout, "every probe loop to have run once", func() (bool, error) {
		runs, err := probeRunsSoFar(t, cycle)
		return err == nil && loopsWithRunAfter(runs, 0) == probeLoops, err
	})

	// The webhook's pods share the namespace, and a pod of an earlier install may still be
	// terminating: the one to delete is the single live kubelet-plugin pod.
	var old string
	eventually(t, defaultTimeout, "exactly one live kubelet-plugin pod", func() (bool, error) {
		pods, err := kube.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{LabelSelector: pluginSelector})
		if err != nil {
			return false, err
		}
		var live []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				live = append(live, p.Name)
			}
		}
		if len(live) == 1 && len(pods.Items) == 1 {
			old = live[0]
			return true, nil
		}
		return false, fmt.Errorf("kubelet-plugin pods %d, live %v", len(pods.Items), live)
	})
	oldIno := inode(hostRegistrySocket)
	deleted := uptime(t)
	// A normal deletion: SIGTERM, then the grace period.
	if err := kube.CoreV1().Pods(pluginNS).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Polled every 10 ms (not at the suite's poll interval): these times are what the probes'
	// times are compared with.
	var gone, back float64
	for end := time.Now().Add(defaultTimeout); back == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for the old registry socket to go and a new one to appear")
		}
		ino, now := inode(hostRegistrySocket), uptime(t)
		if gone == 0 && ino != oldIno {
			gone = now
		}
		if ino != 0 && ino != oldIno {
			back = now
		}
	}
	var ready float64
	eventually(t, defaultTimeout, "the new plugin pod Ready", func() (bool, error) {
		list, err := kube.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{LabelSelector: pluginSelector})
		if err != nil || len(list.Items) != 1 || list.Items[0].Name == old || !podReady(&list.Items[0]) {
			return false, err
		}
		ready = uptime(t)
		return true, nil
	})
	// Let every loop finish a probe that started after the new registry served.
	eventually(t, defaultTimeout, "a probe of every loop after the restart", func() (bool, error) {
		runs, err := probeRunsSoFar(t, cycle)
		return err == nil && loopsWithRunAfter(runs, back) == probeLoops, err
	})
	stopLoops()

	var runs []probeRun
	for k, out := range loops {
		if strings.HasPrefix(out, "error: ") {
			t.Fatalf("probe loop %d: %s", k, out)
		}
		runs = append(runs, parseProbeRuns(t, out)...)
	}
	inGap, longest := 0, 0.0
	for _, r := range runs {
		if r.result != "cuInit=0" {
			errOut, _ := run(t, "kubectl", "exec", "-n", testNS, "restart-probe", "-c", "app", "--",
				"cat", fmt.Sprintf("/tmp/err-%d-%d-%d", cycle, r.loop, r.index))
			t.Errorf("probe %d of loop %d (started %.2f s after the delete, took %.2f s): %q; stderr: %s",
				r.index, r.loop, r.start-deleted, r.end-r.start, r.result, errOut)
		}
		// Covered: a probe that started while there was no socket, or one that started before
		// and was still waiting (RETRY, reconnects) when the new socket came.
		if (r.start >= gone && r.start < back) || (r.start < gone && r.end >= back) {
			inGap++
			longest = max(longest, r.end-r.start)
		}
	}
	t.Logf("plugin pod restart: old socket gone %.2f s after the delete, new socket %.2f s after, pod Ready %.2f s after; "+
		"%d probes, %d ran across the time without a socket (longest took %.2f s)",
		gone-deleted, back-deleted, ready-deleted, len(runs), inGap, longest)
	if inGap == 0 {
		t.Errorf("no probe ran while there was no registry socket: the restart was not covered")
	}
}

// probeRunsSoFar reads the runs the loops of cycle have logged so far.
func probeRunsSoFar(t *testing.T, cycle int) ([]probeRun, error) {
	out, err := run(t, "kubectl", "exec", "-n", testNS, "restart-probe", "-c", "app", "--", "sh", "-c",
		fmt.Sprintf("cat /tmp/probe-%d-*.log 2>/dev/null; true", cycle))
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, out)
	}
	return parseProbeRuns(t, out), nil
}

func parseProbeRuns(t *testing.T, out string) []probeRun {
	var runs []probeRun
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		r := probeRun{result: strings.Join(f[4:], " ")}
		var err error
		if r.loop, err = strconv.Atoi(f[0]); err == nil {
			if r.index, err = strconv.Atoi(f[1]); err == nil {
				if r.start, err = strconv.ParseFloat(f[2], 64); err == nil {
					r.end, err = strconv.ParseFloat(f[3], 64)
				}
			}
		}
		if err != nil {
			t.Fatalf("probe log line %q: %v", line, err)
		}
		runs = append(runs, r)
	}
	return runs
}

// loopsWithRunAfter counts the loops that logged a run started after the uptime after.
func loopsWithRunAfter(runs []probeRun, after float64) int {
	var loops []int
	for _, r := range runs {
		if r.start > after && !slices.Contains(loops, r.loop) {
			loops = append(loops, r.loop)
		}
	}
	return len(loops)
}

// uptime is the host's /proc/uptime, which a container reads too: one clock for the test and
// the probes, in seconds with centisecond steps.
func uptime(t *testing.T) float64 {
	t.Helper()
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// inode is the inode of path, 0 when it is missing.
func inode(path string) uint64 {
	st, err := os.Lstat(path)
	if err != nil {
		return 0
	}
	return st.Sys().(*syscall.Stat_t).Ino
}
