//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// TestVGPU walks the scenarios of issue 6 in order on one install: each builds on the state
// the previous one left, as a user's cluster would.
func TestVGPU(t *testing.T) {
	ctx := context.Background()
	t.Run("1-chart-installs-and-publishes", func(t *testing.T) {
		installChart(t)
		var slice resourceapi.ResourceSlice
		eventually(t, defaultTimeout, "the node's ResourceSlice", func() (bool, error) {
			list, err := kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driverName})
			if err != nil || len(list.Items) == 0 {
				return false, err
			}
			slice = list.Items[0]
			return true, nil
		})
		if n := len(slice.Spec.Devices); n != 1 {
			t.Fatalf("slice has %d devices, want the 1 simulated H200", n)
		}
		d := slice.Spec.Devices[0]
		if d.Name != "gpu-0" || d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Errorf("device %s shareable=%v", d.Name, d.AllowMultipleAllocations)
		}
		if v := d.Attributes["driverVersion"].VersionValue; v == nil || *v != "550.54.15" {
			t.Errorf("driverVersion %v", v)
		}
		if c := d.Capacity["cores"]; c.Value.Value() != 100 {
			t.Errorf("cores capacity %v", c.Value)
		}
		if _, err := kube.ResourceV1().DeviceClasses().Get(ctx, driverName, metav1.GetOptions{}); err != nil {
			t.Errorf("DeviceClass: %v", err)
		}
	})
	ensureNamespace(t)

	var claimA, claimB *resourceapi.ResourceClaim
	t.Run("2-two-pods-share-one-gpu", func(t *testing.T) {
		claimA = createClaim(t, claimFor("share-a", "10Gi", 30))
		claimB = createClaim(t, claimFor("share-b", "10Gi", 30))
		createPod(t, vgpuPod("share-a", "share-a"))
		createPod(t, vgpuPod("share-b", "share-b"))
		for _, p := range []struct {
			pod   string
			claim *resourceapi.ResourceClaim
		}{{"share-a", claimA}, {"share-b", claimB}} {
			start := time.Now()
			pod := waitRunning(t, p.pod)
			t.Logf("%s Running after %v", p.pod, time.Since(start).Round(100*time.Millisecond))
			env := envOf(t, p.pod)
			for k, want := range map[string]string{
				"CUDA_MEM_LIMIT_0": "10240m", "CUDA_CORE_LIMIT_0": "30",
				"MANAGER_VGPU_CLAIM_UID": string(p.claim.UID),
				"VGPU_POD_UID":           string(pod.UID), "VGPU_CONTAINER_NAME": "app",
			} {
				if env[k] != want {
					t.Errorf("%s: env %s=%q, want %q", p.pod, k, env[k], want)
				}
			}
			if !strings.HasPrefix(env["MANAGER_VISIBLE_DEVICE_0"], "GPU-") {
				t.Errorf("%s: MANAGER_VISIBLE_DEVICE_0=%q", p.pod, env["MANAGER_VISIBLE_DEVICE_0"])
			}
			mounts := mountsOf(t, p.pod)
			if opts, ok := mounts["/etc/vgpu-dra/config"]; !ok || !slices.Contains(strings.Split(opts, ","), "ro") {
				t.Errorf("%s: /etc/vgpu-dra/config mount %q (want read-only)", p.pod, opts)
			}
			for _, m := range []string{"/tmp/.vgpu_lock", "/tmp/.vmem_node", "/etc/vgpu-dra/registry"} {
				if _, ok := mounts[m]; !ok {
					t.Errorf("%s: %s not mounted", p.pod, m)
				}
			}
			// The workload registers through the socket; pids.config then lists its host PIDs.
			out := execIn(t, p.pod, "vgpu-registry-client")
			if !strings.Contains(out, "OK") {
				t.Errorf("%s: registration: %s", p.pod, out)
			}
			if pids := pidLines(out); len(pids) == 0 {
				t.Errorf("%s: pids.config lists no PIDs: %q", p.pod, out)
			}
		}
	})

	t.Run("3-more-than-is-left-stays-pending", func(t *testing.T) {
		// 141Gi GPU, 20Gi taken: 125Gi does not fit until one of the first pods goes.
		createClaim(t, claimFor("too-big", "125Gi", 10))
		createPod(t, vgpuPod("too-big", "too-big"))
		eventually(t, defaultTimeout, "the scheduler to report too-big unschedulable", func() (bool, error) {
			pod, err := kube.CoreV1().Pods(testNS).Get(ctx, "too-big", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					return true, nil
				}
			}
			return false, nil
		})
		time.Sleep(2 * time.Second)
		if pod, _ := kube.CoreV1().Pods(testNS).Get(ctx, "too-big", metav1.GetOptions{}); pod.Spec.NodeName != "" {
			t.Fatalf("too-big was scheduled with 121Gi left")
		}
		deletePod(t, "share-b")
		// The scheduler retries an unschedulable pod when a cluster event may make it fit, and
		// at the latest when it flushes its unschedulable queue (5 min): the limit covers both.
		start := time.Now()
		waitRunningWithin(t, "too-big", 6*time.Minute)
		t.Logf("too-big scheduled %v after share-b was deleted", time.Since(start).Round(100*time.Millisecond))
		deletePod(t, "too-big")
	})

	t.Run("4-forged-claim-uid-gets-no-vgpu-mounts", func(t *testing.T) {
		forged := vgpuPod("forged", "")
		forged.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "MANAGER_VGPU_CLAIM_UID", Value: string(claimA.UID)}}
		createPod(t, forged) // no claim: the webhook never sees it (a vGPU container with this env it refuses)
		waitRunning(t, "forged")
		mounts := mountsOf(t, "forged")
		for _, m := range []string{"/etc/vgpu-dra/config", "/tmp/.vgpu_lock", "/tmp/.vmem_node"} {
			if _, ok := mounts[m]; ok {
				t.Errorf("forged pod got %s", m)
			}
		}
		if env := envOf(t, "forged"); env["VGPU_POD_UID"] != "" {
			t.Errorf("forged pod got identity env %q", env["VGPU_POD_UID"])
		}
		deletePod(t, "forged")
	})

	t.Run("5-containerd-restart", func(t *testing.T) {
		before := pidLines(execIn(t, "share-a", "vgpu-registry-client"))
		mustRunScript(t, "hack/cluster-restart-containerd.sh")
		// The running pod keeps working: the plugin reconnected and Synchronize rebuilt its
		// cache entry, so the registration resolves to the same container directory.
		var out string
		eventually(t, defaultTimeout, "share-a to register after the restart", func() (bool, error) {
			o, err := run(t, "kubectl", "exec", "-n", testNS, "share-a", "-c", "app", "--", "vgpu-registry-client")
			out = o
			return err == nil && strings.Contains(o, "status: OK"), fmt.Errorf("%v: %s", err, o)
		})
		if after := pidLines(out); !overlaps(before, after) {
			t.Errorf("pids.config after the restart %v shares no PID with before %v: another directory?", after, before)
		}
		// A new vGPU pod (refused by containerd's validator unless our NRI plugin is back)
		// starts with its per-container directories.
		createClaim(t, claimFor("after-restart", "1Gi", 5))
		createPod(t, vgpuPod("after-restart", "after-restart"))
		waitRunning(t, "after-restart")
		if _, ok := mountsOf(t, "after-restart")["/etc/vgpu-dra/config"]; !ok {
			t.Error("pod created after the containerd restart has no vGPU config mount")
		}
		deletePod(t, "after-restart")
	})

	t.Run("6-plugin-pod-replaced", func(t *testing.T) {
		before := pidLines(execIn(t, "share-a", "vgpu-registry-client"))
		pods, err := kube.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{LabelSelector: pluginSelector})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("plugin pods: %v %v", pods, err)
		}
		old := pods.Items[0].Name
		if err := kube.CoreV1().Pods(pluginNS).Delete(ctx, old, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)}); err != nil {
			t.Fatal(err)
		}
		// Registered while the plugin is gone or starting: failed connects and RETRY are
		// retried within the library's budget (contract §5), the client's default.
		out := execIn(t, "share-a", "vgpu-registry-client")
		t.Logf("registration across the plugin restart: %s", strings.SplitN(out, "\n", 2)[0])
		if !strings.Contains(out, "status: OK") {
			t.Fatalf("registration across the plugin restart: %s", out)
		}
		if after := pidLines(out); !overlaps(before, after) {
			t.Errorf("pids.config %v shares no PID with before %v: a wrong directory?", after, before)
		}
		mustRun(t, "kubectl", "-n", pluginNS, "rollout", "status", "daemonset/"+release+"-kubelet-plugin", "--timeout=2m")
	})

	t.Run("8-per-claim-path-without-nri", func(t *testing.T) {
		installChart(t, "--set", "featureGates.NRISupport=false")
		defer installChart(t)
		createClaim(t, claimFor("per-claim", "2Gi", 10))
		createPod(t, vgpuPod("per-claim", "per-claim"))
		// The webhook runs with the same gates: no NRI plugin to require, no annotation.
		if pod := waitRunning(t, "per-claim"); pod.Annotations[requiredPlugins] != "" {
			t.Errorf("per-claim pod annotated %q with NRISupport off", pod.Annotations[requiredPlugins])
		}
		env := envOf(t, "per-claim")
		if env["MANAGER_VGPU_CLAIM_UID"] != "" || len(env["MANAGER_CLIENT_REGISTER_UUID"]) != 36 || env["CUDA_MEM_LIMIT_0"] != "2048m" {
			t.Errorf("per-claim env: claim uid %q, register uuid %q, mem %q", env["MANAGER_VGPU_CLAIM_UID"], env["MANAGER_CLIENT_REGISTER_UUID"], env["CUDA_MEM_LIMIT_0"])
		}
		for _, m := range []string{"/etc/vgpu-dra/config", "/tmp/.vgpu_lock", "/tmp/.vmem_node"} {
			if _, ok := mountsOf(t, "per-claim")[m]; !ok {
				t.Errorf("per-claim pod: %s not mounted", m)
			}
		}
		out := execIn(t, "per-claim", "vgpu-registry-client")
		if !strings.Contains(out, "status: OK") || len(pidLines(out)) == 0 {
			t.Errorf("per-claim registration: %s", out)
		}
		deletePod(t, "per-claim")
	})

	t.Run("9-library-refuses-past-the-claim", func(t *testing.T) {
		createClaim(t, claimFor("cuda", "1Gi", 10))
		createPod(t, vgpuPod("cuda", "cuda"))
		waitRunning(t, "cuda")
		// Nothing in the container has registered yet: busybox is static and never loads the
		// preloaded library. The first CUDA call of the probe registers.
		if out := execIn(t, "cuda", "cat /etc/vgpu-dra/config/pids.config 2>/dev/null || echo absent"); strings.TrimSpace(out) != "absent" {
			t.Fatalf("pids.config before any CUDA call: %q", out)
		}
		// vgpu_probe links the fake libcuda (library/test), whose one GPU is the claim's. Its
		// allocations are kept: 768 MiB fits in 1Gi, 512 MiB more does not
		// (CUDA_ERROR_OUT_OF_MEMORY = 2), 256 MiB more fills it exactly.
		out := probeOutput(execIn(t, "cuda", `FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe alloc 768 512 256 2>/tmp/probe.err; echo "exit $?"`))
		t.Logf("vgpu_probe in a 1Gi claim:\n%sstderr: %q", out, execIn(t, "cuda", "cat /tmp/probe.err"))
		want := "alloc 768 MiB = 0\nalloc 512 MiB = 2\nalloc 256 MiB = 0\nexit 0\n"
		if out != want {
			t.Errorf("vgpu_probe alloc 768 512 256 printed %q, want %q", out, want)
		}
		if pids := pidLines(execIn(t, "cuda", "cat /etc/vgpu-dra/config/pids.config")); len(pids) == 0 {
			t.Errorf("the library did not register: pids.config lists no PID")
		}
		// A tenant who wants more blanks, unsets or raises the limit in its own env: the limit
		// comes from the read-only vgpu.config, so nothing changes (contract §4a).
		for _, tamper := range []string{"CUDA_MEM_LIMIT_0=", "CUDA_MEM_LIMIT_0=999999m", "env -u CUDA_MEM_LIMIT_0 -u MANAGER_VISIBLE_DEVICE_0"} {
			out := probeOutput(execIn(t, "cuda", `FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" `+tamper+` vgpu_probe alloc 768 512 256 2>/dev/null; echo "exit $?"`))
			if out != want {
				t.Errorf("with %q the probe printed %q, want %q: the env raised the limit", tamper, out, want)
			}
		}
		if out := execIn(t, "cuda", "echo x > /etc/vgpu-dra/config/vgpu.config 2>&1; cat /etc/vgpu-dra/config/vgpu.config"); !strings.Contains(out, "gpu 0 ") || !strings.Contains(out, " 1073741824 10") {
			t.Errorf("vgpu.config after the container tried to write it:\n%s", out)
		}
		deletePod(t, "cuda")
	})

	t.Run("11-writable-dirs-are-bounded", func(t *testing.T) {
		createClaim(t, claimFor("filler", "1Gi", 10))
		createPod(t, vgpuPod("filler", "filler"))
		waitRunning(t, "filler")
		// The container writes into its writable vGPU directory until the file system says no:
		// it stops at the claim's tmpfs (the chart's claimFSSize, 32Mi), not at the node's disk.
		out := execIn(t, "filler", "dd if=/dev/zero of=/tmp/.vmem_node/fill bs=1M count=256 2>&1; echo; stat -c %s /tmp/.vmem_node/fill")
		fields := strings.Fields(out)
		size := fields[len(fields)-1]
		if !strings.Contains(out, "No space left") {
			t.Errorf("filling /tmp/.vmem_node: %q, want ENOSPC", out)
		}
		if n, err := strconv.ParseInt(size, 10, 64); err != nil || n > 32<<20 || n < 16<<20 {
			t.Errorf("the fill stopped at %s bytes, want close to the 32Mi bound", size)
		}
		// Nobody else is harmed: a new claim on the node prepares and its pod runs.
		createClaim(t, claimFor("after-fill", "1Gi", 10))
		createPod(t, vgpuPod("after-fill", "after-fill"))
		waitRunning(t, "after-fill")
		deletePod(t, "after-fill")
		deletePod(t, "filler")
	})

	t.Run("10-plugin-stopped-container-refused", func(t *testing.T) {
		// The kubelet prepares a pod's claims once, before its sandbox; with the driver
		// unregistered it would refuse to prepare at all (a FailedPrepareDynamicResources
		// event, nothing created). The case that needs the runtime's protection is a claim
		// prepared while the plugin ran and a container created after it stopped: an init
		// container (no claim, so no required-plugins annotation) holds the pod there until the
		// plugin is gone. Nobody writes the annotation by hand: the webhook adds it to app only.
		claim := createClaim(t, claimFor("no-plugin", "1Gi", 5))
		p := vgpuPod("no-plugin", "no-plugin")
		p.Spec.InitContainers = []corev1.Container{{
			Name: "wait", Image: cluster.WorkloadImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"sh", "-c", "until [ -e /tmp/go ]; do sleep 0.2; done"},
		}}
		created, err := kube.CoreV1().Pods(testNS).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := created.Annotations; got[requiredPlugins] != `["`+driverName+`"]` || len(got) != 1 {
			t.Fatalf("annotations of the admitted pod: %v, want only %s from the webhook", got, requiredPlugins)
		}
		spec := "/var/run/cdi/" + driverName + "-claim_" + string(claim.UID) + ".json"
		eventually(t, defaultTimeout, "the claim prepared and the init container running", func() (bool, error) {
			pod, err := kube.CoreV1().Pods(testNS).Get(ctx, "no-plugin", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			_, statErr := os.Stat(spec)
			running := len(pod.Status.InitContainerStatuses) == 1 && pod.Status.InitContainerStatuses[0].State.Running != nil
			return statErr == nil && running, fmt.Errorf("spec: %v, init: %v", statErr, pod.Status.InitContainerStatuses)
		})

		// Stop the plugin the way an operator would take it off a node: a nodeSelector that
		// matches no node. The DaemonSet controller deletes its pod; with it go the NRI plugin
		// and the kubelet registration.
		ds := kube.AppsV1().DaemonSets(pluginNS)
		dsName := release + "-kubelet-plugin"
		patch := func(value string) {
			t.Helper()
			body := `{"spec":{"template":{"spec":{"nodeSelector":{"vgpu-e2e/plugin-stopped":` + value + `}}}}}`
			if _, err := ds.Patch(ctx, dsName, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
				t.Fatalf("patch the plugin DaemonSet: %v", err)
			}
		}
		patch(`"true"`)
		restored := false
		restore := func() {
			if !restored {
				restored = true
				patch("null")
				mustRun(t, "kubectl", "-n", pluginNS, "rollout", "status", "daemonset/"+dsName, "--timeout=2m")
			}
		}
		defer restore()
		eventually(t, defaultTimeout, "the plugin pod gone", func() (bool, error) {
			list, err := kube.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{LabelSelector: pluginSelector})
			return err == nil && len(list.Items) == 0, err
		})

		mustRun(t, "kubectl", "exec", "-n", testNS, "no-plugin", "-c", "wait", "--", "touch", "/tmp/go")
		// containerd's default NRI validator refuses the app container: it requires the
		// absent plugin (contract §1). Without that the container would start with its
		// limits in the env but nothing to register with: never unlimited silently.
		wantMsg := `required plugin "` + driverName + `" not present`
		var app corev1.ContainerStatus
		eventually(t, defaultTimeout, "the runtime to refuse the app container", func() (bool, error) {
			pod, err := kube.CoreV1().Pods(testNS).Get(ctx, "no-plugin", metav1.GetOptions{})
			if err != nil || len(pod.Status.ContainerStatuses) != 1 {
				return false, err
			}
			app = pod.Status.ContainerStatuses[0]
			if app.State.Running != nil || app.State.Terminated != nil {
				t.Fatalf("app container started without the plugin: %+v", app.State)
			}
			w := app.State.Waiting
			return w != nil && w.Reason == "CreateContainerError" && strings.Contains(w.Message, wantMsg), fmt.Errorf("app: %+v", app.State)
		})
		t.Logf("refused while the plugin is stopped: %s", app.State.Waiting.Message)
		if pod, err := kube.CoreV1().Pods(testNS).Get(ctx, "no-plugin", metav1.GetOptions{}); err != nil || pod.Status.Phase != corev1.PodPending {
			t.Errorf("pod while refused: phase %v, %v", pod.Status.Phase, err)
		}

		restore()
		// The kubelet retries the container; the plugin, back, gives it its directories.
		waitRunning(t, "no-plugin")
		mounts := mountsOf(t, "no-plugin")
		for _, m := range []string{"/etc/vgpu-dra/config", "/tmp/.vgpu_lock", "/tmp/.vmem_node", "/etc/ld.so.preload"} {
			if _, ok := mounts[m]; !ok {
				t.Errorf("no-plugin after the plugin came back: %s not mounted", m)
			}
		}
		if env := envOf(t, "no-plugin"); env["VGPU_CONTAINER_NAME"] != "app" {
			t.Errorf("no-plugin after the plugin came back: VGPU_CONTAINER_NAME=%q", env["VGPU_CONTAINER_NAME"])
		}
		deletePod(t, "no-plugin")
	})

	t.Run("7-uninstall-leaves-nothing", func(t *testing.T) {
		deletePod(t, "share-a")
		// Every claim the scenarios made, also those added after this list was first written.
		if err := kube.ResourceV1().ResourceClaims(testNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Errorf("delete claims: %v", err)
		}
		eventually(t, defaultTimeout, "claims gone", func() (bool, error) {
			list, err := kube.ResourceV1().ResourceClaims(testNS).List(ctx, metav1.ListOptions{})
			return err == nil && len(list.Items) == 0, err
		})
		// The kubelet unprepares a claim when its last pod is gone; the plugin must still be
		// there to do it. A user uninstalls after that.
		eventually(t, defaultTimeout, "the kubelet to unprepare every claim", func() (bool, error) {
			specs, _ := filepathGlob("/var/run/cdi/" + driverName + "-claim_*.json")
			dirs, _ := filepathGlob("/var/lib/vgpu-dra/claims/*")
			return len(specs) == 0 && len(dirs) == 0, fmt.Errorf("specs %v, claim dirs %v", specs, dirs)
		})
		mustRun(t, "helm", "uninstall", release, "--namespace", pluginNS, "--wait", "--timeout", "2m")
		eventually(t, defaultTimeout, "the plugin's and the webhook's pods gone", func() (bool, error) {
			list, err := kube.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{})
			return err == nil && len(list.Items) == 0, err
		})
		leftovers := func(glob string) []string { m, _ := filepathGlob(glob); return m }
		for _, g := range []string{"/var/run/cdi/" + driverName + "-claim_*.json", "/var/lib/vgpu-dra/claims/*", "/var/lib/vgpu-dra/registry/registry.sock"} {
			if m := leftovers(g); len(m) > 0 {
				t.Errorf("left behind after uninstall: %v", m)
			}
		}
		if _, err := kube.ResourceV1().DeviceClasses().Get(ctx, driverName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("DeviceClass after uninstall: %v", err)
		}
	})
}

func pidLines(out string) []int {
	var pids []int
	for _, l := range strings.Split(out, "\n") {
		if p, err := strconv.Atoi(strings.TrimSpace(l)); err == nil && p > 0 {
			pids = append(pids, p)
		}
	}
	return pids
}

func overlaps(a, b []int) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}
