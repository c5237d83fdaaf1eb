//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// TestEnforcer: the node-side wall (contract §15) on the real cluster. The simulated GPU is
// told what a process holds, as a real GPU would report a process that allocated around
// libvgpu.so; the kubelet plugin's enforcer kills, within its grace, the processes of a container
// over its limit and an unregistered process of a vGPU container, with a Warning event on the
// pod, reports (the chart's default --core-enforcement=report) a container whose process keeps
// far more of the SMs busy than its claim's cores, and leaves a well-behaved neighbour alone.
func TestEnforcer(t *testing.T) {
	installChart(t)
	ensureNamespace(t)
	uuid := simulatedGPUs(t, 1)[0]
	var shares []obsShare
	pods := []string{"enf-over", "enf-unreg", "enf-good", "enf-busy"}
	for _, name := range pods {
		createClaim(t, claimFor(name, "1Gi", 10))
		createPod(t, vgpuPod(name, name))
		shares = append(shares, obsShare{name: name})
	}
	defer cleanupShares(t, shares)
	for _, name := range pods {
		waitRunning(t, name)
	}

	// enf-over: a registered process (libvgpu.so's probe holds 512 MiB through the fake driver)
	// that the GPU says holds 3 GiB, past 1 GiB + the default 640 MiB of context slack.
	execIn(t, "enf-over", `FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe hold 512 >/tmp/hold.out 2>&1 &`)
	over := hostPID(t, "enf-over", "vgpu_probe")
	// enf-good: the same, holding 900 MiB on the GPU: within its limit and slack.
	execIn(t, "enf-good", `FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe hold 512 >/tmp/hold.out 2>&1 &`)
	good := hostPID(t, "enf-good", "vgpu_probe")
	// enf-busy: registered, within its memory, but the GPU says it keeps 80 % of the SMs busy
	// (a tenant who refilled the core limiter's tokens) against its claim's 10 %.
	execIn(t, "enf-busy", `FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe hold 64 >/tmp/hold.out 2>&1 &`)
	busy := hostPID(t, "enf-busy", "vgpu_probe")
	waitRegistered(t, "enf-over")
	waitRegistered(t, "enf-good")
	waitRegistered(t, "enf-busy")
	// enf-unreg: the tenant renames the library's directory away (root in the container needs no
	// capability: /etc/vgpu-dra is a directory of its rootfs, not a mount point), so ld.so
	// ignores /etc/ld.so.preload, and the probe allocates from the driver without libvgpu.so:
	// it never registers. The GPU reports the 100 MiB it holds.
	out := execIn(t, "enf-unreg", `mv /etc/vgpu-dra /etc/x && echo renamed; FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe hold 100 >/tmp/hold.out 2>&1 &`)
	if !strings.Contains(out, "renamed") {
		t.Fatalf("the rename of /etc/vgpu-dra: %q", out)
	}
	waitRegistered(t, "enf-unreg") // its allocation went through, with no registration
	unreg := hostPID(t, "enf-unreg", "vgpu_probe")

	setProcessMemory(t, uuid, good, 900<<20)
	setProcessUsage(t, uuid, busy, 64<<20, 80)
	start := time.Now()
	setProcessMemory(t, uuid, over, 3<<30)
	setProcessMemory(t, uuid, unreg, 100<<20)
	for _, pid := range []int{over, unreg} {
		eventually(t, 30*time.Second, fmt.Sprintf("process %d killed", pid), func() (bool, error) {
			_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
			return os.IsNotExist(err), err
		})
	}
	t.Logf("both processes gone %v after the GPU reported them", time.Since(start).Round(time.Millisecond))
	waitEvent(t, "enf-over", "VGPUMemoryLimitExceeded", "over the claim's limit of 1024 MiB")
	waitEvent(t, "enf-unreg", "VGPUUnregisteredProcess", "without having registered")
	// Reported after the window (10 s by default), once; the process keeps running.
	waitEvent(t, "enf-busy", "VGPUCoreLimitExceeded", "over the claim's core limit of 10%")
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", busy)); err != nil {
		t.Errorf("the process over its core limit is gone (the default only reports): %v", err)
	}

	// The well-behaved neighbour: several more passes, untouched, no event.
	time.Sleep(3 * time.Second)
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", good)); err != nil {
		t.Errorf("the process within its limit is gone: %v", err)
	}
	if evs := vgpuEvents(t, "enf-good"); len(evs) != 0 {
		t.Errorf("events on the well-behaved pod: %v", evs)
	}
	for _, name := range pods {
		if p, err := kube.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s: %v %v; the container's other processes (its init) are not the enforcer's to kill", name, p.Status.Phase, err)
		}
	}
	m, err := scrapeMetrics(net.JoinHostPort(pluginPodIP(t), "8080"))
	if err != nil {
		t.Fatalf("plugin metrics: %v", err)
	}
	for _, reason := range []string{"over-limit", "unregistered"} {
		if v, ok := seriesValue(m, "vgpu_dra_enforcement_actions_total", map[string]string{"action": "kill", "reason": reason}); !ok || v != 1 {
			t.Errorf("enforcement_actions_total{action=kill,reason=%s} = %v (%v), want 1", reason, v, ok)
		}
	}
	if v, ok := seriesValue(m, "vgpu_dra_enforcement_actions_total", map[string]string{"action": "report", "reason": "over-core-limit"}); !ok || v != 1 {
		t.Errorf("enforcement_actions_total{action=report,reason=over-core-limit} = %v (%v), want 1", v, ok)
	}
}

// misbehaving are the pods the suite makes go over their limits on purpose (TestEnforcer, and
// TestObservability's obs-b for the kill alert): the only ones the enforcer may raise events on
// (TestMain's false-positive check).
var misbehaving = map[string]bool{"enf-over": true, "enf-unreg": true, "enf-busy": true, "obs-b": true}

// setProcessMemory tells the simulated GPU that the host process pid holds bytes of it.
func setProcessMemory(t *testing.T, uuid string, pid int, bytes uint64) {
	t.Helper()
	setProcessUsage(t, uuid, pid, bytes, -1)
}

// setProcessUsage tells the simulated GPU that the host process pid holds bytes of it and,
// unless sm is negative, keeps sm % of its SMs busy.
func setProcessUsage(t *testing.T, uuid string, pid int, bytes uint64, sm int) {
	t.Helper()
	url := fmt.Sprintf("http://localhost/gpus/%s/processes/%d?memory=%d", uuid, pid, bytes)
	if sm >= 0 {
		url += fmt.Sprintf("&sm=%d", sm)
	}
	req, _ := http.NewRequest(http.MethodPost, url, nil)
	resp, err := controlClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("set process %d's memory: %s", pid, resp.Status)
	}
}

// hostPID finds, on the host, the process with this command name in the pod's containers (its
// cgroup names the pod: the kubelet's pod<UID> component).
func hostPID(t *testing.T, pod, comm string) int {
	t.Helper()
	p, err := kube.CoreV1().Pods(testNS).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var found int
	eventually(t, 30*time.Second, fmt.Sprintf("a %s process of pod %s on the host", comm, pod), func() (bool, error) {
		dirs, _ := filepath.Glob("/proc/[0-9]*")
		for _, d := range dirs {
			c, err := os.ReadFile(filepath.Join(d, "comm"))
			if err != nil || strings.TrimSpace(string(c)) != comm {
				continue
			}
			cg, err := os.ReadFile(filepath.Join(d, "cgroup"))
			if err == nil && strings.Contains(string(cg), "pod"+string(p.UID)) {
				found, _ = strconv.Atoi(filepath.Base(d))
				return true, nil
			}
		}
		return false, fmt.Errorf("none")
	})
	return found
}

// waitRegistered waits until the probe in the pod holds its memory (with libvgpu.so it prints
// its allocation only after the library registered and let CUDA initialise).
func waitRegistered(t *testing.T, pod string) {
	t.Helper()
	eventually(t, 30*time.Second, pod+"'s probe holding its memory", func() (bool, error) {
		out, err := run(t, "kubectl", "exec", "-n", testNS, pod, "-c", "app", "--", "cat", "/tmp/hold.out")
		return err == nil && strings.Contains(out, "= 0"), fmt.Errorf("%q %v", out, err)
	})
}

// vgpuEvents are the pod's events of the enforcer.
func vgpuEvents(t *testing.T, pod string) []corev1.Event {
	t.Helper()
	// The pod of this name now: an earlier run's pod of the same name left its events (-count).
	p, err := kube.CoreV1().Pods(testNS).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := kube.CoreV1().Events(testNS).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range l.Items {
		if e.Source.Component == cluster.EnforcerComponent && e.InvolvedObject.UID == p.UID {
			out = append(out, e)
		}
	}
	return out
}

// waitEvent waits for the enforcer's Warning event with this reason on the pod.
func waitEvent(t *testing.T, pod, reason, text string) {
	t.Helper()
	eventually(t, defaultTimeout, fmt.Sprintf("event %s on %s", reason, pod), func() (bool, error) {
		for _, e := range vgpuEvents(t, pod) {
			if e.Reason == reason && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, text) {
				t.Logf("event on %s: %s %s", pod, e.Reason, e.Message)
				return true, nil
			}
		}
		return false, fmt.Errorf("events %v", vgpuEvents(t, pod))
	})
}
