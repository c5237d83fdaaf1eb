//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	dpResource     = corev1.ResourceName(driverName + "/vgpu")
	dpDebugSocket  = "/var/lib/vgpu-dra/device-plugin-debug.sock"
	dpPluginSocket = "/var/lib/kubelet/device-plugins/vgpu.dra.dev-vgpu.sock"
	dpShares       = 2
	dpCores        = 30
)

// TestDevicePlugin walks device-plugin mode (issue 13) on one install, on the same cluster and
// simulated H200 as TestVGPU: the chart in mode device-plugin, two shares per GPU.
func TestDevicePlugin(t *testing.T) {
	ctx := context.Background()
	ensureNamespace(t)
	node := onlyNode(t)
	t.Cleanup(func() {
		// Whatever happened, TestVGPU must find the release gone.
		for _, p := range []string{"dp-a", "dp-b", "dp-c", "dp-d"} {
			_ = kube.CoreV1().Pods(testNS).Delete(ctx, p, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)})
		}
		_, _ = run(t, "helm", "uninstall", release, "--namespace", pluginNS, "--wait", "--timeout", "2m", "--ignore-not-found")
	})

	var shareMiB int64
	t.Run("1-chart-installs-the-device-plugin", func(t *testing.T) {
		installChartFor(t, "device-plugin", "--set", "mode=device-plugin",
			"--set", "devicePlugin.sharesPerGPU="+strconv.Itoa(dpShares), "--set", "devicePlugin.shareCores="+strconv.Itoa(dpCores))
		if _, err := kube.AppsV1().DaemonSets(pluginNS).Get(ctx, release+"-kubelet-plugin", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the kubelet plugin is installed in device-plugin mode: %v", err)
		}
		if _, err := kube.ResourceV1().DeviceClasses().Get(ctx, driverName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the DeviceClass is installed in device-plugin mode: %v", err)
		}
		waitAllocatable(t, node, dpShares, defaultTimeout)
		n, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		labels := n.Labels
		if labels[string(dpResource)+".shares-per-gpu"] != strconv.Itoa(dpShares) || labels[string(dpResource)+".cores"] != strconv.Itoa(dpCores) {
			t.Errorf("share labels %v", labels)
		}
		if shareMiB, err = strconv.ParseInt(labels[string(dpResource)+".memory-mib"], 10, 64); err != nil || shareMiB < 1024 {
			t.Fatalf("label %s.memory-mib = %q", dpResource, labels[string(dpResource)+".memory-mib"])
		}
		t.Logf("node %s: %d shares of %d MiB and %d%% of the SMs; annotation %s", node, dpShares, shareMiB, dpCores, n.Annotations[string(dpResource)+".shares"])
	})

	regUUID := map[string]string{}
	t.Run("2-two-pods-share-one-gpu", func(t *testing.T) {
		for _, p := range []string{"dp-a", "dp-b"} {
			createPod(t, sharePod(p, 1))
		}
		for _, p := range []string{"dp-a", "dp-b"} {
			waitRunning(t, p)
			env := envOf(t, p)
			for k, want := range map[string]string{
				"CUDA_MEM_LIMIT_0": fmt.Sprintf("%dm", shareMiB), "CUDA_CORE_LIMIT_0": strconv.Itoa(dpCores), "MANAGER_VGPU_CLAIM_UID": "",
			} {
				if env[k] != want {
					t.Errorf("%s: env %s=%q, want %q", p, k, env[k], want)
				}
			}
			regUUID[p] = env["MANAGER_CLIENT_REGISTER_UUID"]
			config := execIn(t, p, "cat /etc/vgpu-dra/config/vgpu.config")
			if !strings.Contains(config, "register "+regUUID[p]+"\n") ||
				!strings.Contains(config, fmt.Sprintf("gpu 0 %s %d %d\n", env["MANAGER_VISIBLE_DEVICE_0"], shareMiB<<20, dpCores)) {
				t.Errorf("%s: vgpu.config does not hold its share's identity and limits:\n%s", p, config)
			}
			mounts := mountsOf(t, p)
			if opts, ok := mounts["/etc/vgpu-dra/config"]; !ok || !slices.Contains(strings.Split(opts, ","), "ro") {
				t.Errorf("%s: /etc/vgpu-dra/config mount %q (want read-only)", p, opts)
			}
			for _, m := range []string{"/tmp/.vgpu_lock", "/tmp/.vmem_node", "/etc/vgpu-dra/registry", "/etc/ld.so.preload"} {
				if _, ok := mounts[m]; !ok {
					t.Errorf("%s: %s not mounted", p, m)
				}
			}
			out := execIn(t, p, "vgpu-registry-client")
			if !strings.Contains(out, "status: OK") || len(pidLines(out)) == 0 {
				t.Errorf("%s: registration: %s", p, out)
			}
		}
		if regUUID["dp-a"] == regUUID["dp-b"] || len(regUUID["dp-a"]) != 36 {
			t.Fatalf("register UUIDs %v: want two distinct UUIDs", regUUID)
		}
		// A pod that names the other pod's share is refused: the kubelet says who holds it.
		out, _ := run(t, "kubectl", "exec", "-n", testNS, "dp-a", "-c", "app", "--", "vgpu-registry-client", "--once", "--pids-config=", "--register-uuid="+regUUID["dp-b"])
		if !strings.Contains(out, "DENIED") {
			t.Errorf("dp-a registering for dp-b's share: %s", out)
		}
		// The library enforces the share: the fake driver's one GPU is the share's.
		probe := fmt.Sprintf(`FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe alloc %d 512 192 2>/tmp/probe.err; echo "exit $?"`, shareMiB-192)
		want := fmt.Sprintf("alloc %d MiB = 0\nalloc 512 MiB = 2\nalloc 192 MiB = 0\nexit 0\n", shareMiB-192)
		// The probe prints its PID first; what matters is the allocations.
		got := execIn(t, "dp-a", probe)
		if first, rest, ok := strings.Cut(got, "\n"); ok && strings.HasPrefix(first, "pid ") {
			got = rest
		}
		if got != want {
			t.Errorf("vgpu_probe in a %d MiB share printed %q, want %q (stderr %q)", shareMiB, got, want, execIn(t, "dp-a", "cat /tmp/probe.err"))
		}
	})

	t.Run("3-all-shares-taken-next-pod-pending", func(t *testing.T) {
		createPod(t, sharePod("dp-c", 1))
		var msg string
		eventually(t, defaultTimeout, "the scheduler to report dp-c unschedulable", func() (bool, error) {
			pod, err := kube.CoreV1().Pods(testNS).Get(ctx, "dp-c", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					msg = c.Message
					return strings.Contains(c.Message, "Insufficient "+string(dpResource)), nil
				}
			}
			return false, fmt.Errorf("conditions %v", pod.Status.Conditions)
		})
		t.Logf("dp-c: %s", msg)
		deletePod(t, "dp-c")
	})

	t.Run("4-kubelet-restart", func(t *testing.T) {
		before := dpDebug(t).Registrations
		restart := time.Now().Truncate(time.Second)
		mustRunScript(t, "hack/cluster-restart-kubelet.sh")
		up := time.Now()
		// Back means: the restarted kubelet has posted the node's status (its Ready heartbeat is
		// newer than the restart) with every share allocatable. A plugin that does not register
		// again leaves it at 0: the kubelet keeps a resource's devices unhealthy until then.
		eventually(t, 10*time.Second, "the restarted kubelet to report every share allocatable", func() (bool, error) {
			n, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			q := n.Status.Allocatable[dpResource]
			fresh := false
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && !c.LastHeartbeatTime.Time.Before(restart) {
					fresh = true
				}
			}
			return fresh && q.Value() == dpShares, fmt.Errorf("allocatable %s, status posted since the restart: %v", q.String(), fresh)
		})
		t.Logf("allocatable %d back %v after the restarted kubelet was healthy", dpShares, time.Since(up).Round(100*time.Millisecond))
		if after := dpDebug(t).Registrations; after <= before {
			t.Errorf("the plugin counts %d registrations after the restart, %d before: it did not register again", after, before)
		}
		// Gracefully: the API server lets the pod go once the kubelet has stopped it, so the
		// kubelet has freed its share when dp-d arrives. (A forced delete frees it in the API at
		// once and in the kubelet a moment later: a pod admitted in between is rejected with
		// UnexpectedAdmissionError — the kubelet's behaviour with any device plugin.)
		deletePodGracefully(t, "dp-b")
		createPod(t, sharePod("dp-d", 1))
		waitRunning(t, "dp-d")
		if out := execIn(t, "dp-d", "vgpu-registry-client"); !strings.Contains(out, "status: OK") {
			t.Errorf("dp-d after the kubelet restart: %s", out)
		}
	})

	t.Run("5-gpu-fault-and-recovery", func(t *testing.T) {
		st := dpDebug(t)
		if len(st.Shares) == 0 {
			t.Fatalf("debug state without shares: %+v", st)
		}
		gpu := strings.SplitN(st.Shares[0].ID, "::", 2)[0]
		dpInjectHealth(t, gpu, "healthy=false&xid=79") // fallen off the bus: fatal
		waitAllocatable(t, node, 0, defaultTimeout)
		if n, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil {
			c := n.Status.Capacity[dpResource]
			t.Logf("after XID 79: capacity %s, allocatable 0", c.String())
		}
		dpInjectHealth(t, gpu, "healthy=true")
		waitAllocatable(t, node, dpShares, defaultTimeout)
	})

	t.Run("6-uninstall", func(t *testing.T) {
		deletePod(t, "dp-a")
		deletePod(t, "dp-d")
		// No container holds a share: the plugin removes their directories (after its grace).
		eventually(t, defaultTimeout, "the share directories gone", func() (bool, error) {
			dirs, _ := filepathGlob("/var/lib/vgpu-dra/claims/*")
			return len(dirs) == 0, fmt.Errorf("left: %v", dirs)
		})
		mustRun(t, "helm", "uninstall", release, "--namespace", pluginNS, "--wait", "--timeout", "2m")
		eventually(t, defaultTimeout, "the plugin pod gone", func() (bool, error) {
			list, err := kube.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{})
			return err == nil && len(list.Items) == 0, err
		})
		if _, err := os.Stat(dpPluginSocket); !os.IsNotExist(err) {
			t.Errorf("plugin socket after uninstall: %v", err)
		}
		// What stays by design (contract §13): the shares' CDI spec (a restart must not take it
		// from containers) and the size labels; the next install rewrites both.
		if _, err := os.Stat("/var/run/cdi/" + driverName + "-share.json"); err != nil {
			t.Logf("shares' CDI spec: %v", err)
		}
	})
}

// deletePodGracefully deletes a pod with its own grace period and waits until it is gone.
func deletePodGracefully(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	if err := kube.CoreV1().Pods(testNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	eventually(t, defaultTimeout, "pod "+name+" gone", func() (bool, error) {
		_, err := kube.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
}

// sharePod runs the test workload with n shares of the resource.
func sharePod(name string, n int64) *corev1.Pod {
	p := vgpuPod(name, "")
	delete(p.Annotations, "required-plugins.noderesource.dev/container.app") // no NRI plugin in this mode
	q := *resource.NewQuantity(n, resource.DecimalSI)
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{dpResource: q}
	return p
}

// onlyNode is the cluster's one node.
func onlyNode(t *testing.T) string {
	t.Helper()
	list, err := kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("nodes: %v, %v; want one", list, err)
	}
	return list.Items[0].Name
}

// waitAllocatable waits until the node's allocatable of the resource is want.
func waitAllocatable(t *testing.T, node string, want int64, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("allocatable %s = %d", dpResource, want), func() (bool, error) {
		n, err := kube.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		q, ok := n.Status.Allocatable[dpResource]
		return ok && q.Value() == want, fmt.Errorf("allocatable %v", q.String())
	})
}

// dpDebugClient talks HTTP to the device plugin's debug socket on the host.
var dpDebugClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
	DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Clean(dpDebugSocket))
	},
}}

// dpDebugState is the part of deviceplugin.DebugState the suite reads.
type dpDebugState struct {
	Registered    bool  `json:"registered"`
	Registrations int64 `json:"registrations"`
	Shares        []struct {
		ID      string `json:"id"`
		Healthy bool   `json:"healthy"`
	} `json:"shares"`
}

func dpDebug(t *testing.T) dpDebugState {
	t.Helper()
	var st dpDebugState
	eventually(t, defaultTimeout, "the device plugin's debug endpoint", func() (bool, error) {
		resp, err := dpDebugClient.Get("http://debug/")
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&st) == nil, nil
	})
	return st
}

// dpInjectHealth makes the simulated GPU fail or recover through the plugin's NVML event path.
func dpInjectHealth(t *testing.T, gpu, query string) {
	t.Helper()
	resp, err := dpDebugClient.Post("http://debug/health?gpu="+gpu+"&"+query, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("inject %s into %s: HTTP %d", query, gpu, resp.StatusCode)
	}
}
