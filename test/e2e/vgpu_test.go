//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		waitRunning(t, "too-big")
		deletePod(t, "too-big")
	})

	t.Run("4-forged-claim-uid-gets-no-vgpu-mounts", func(t *testing.T) {
		forged := vgpuPod("forged", "")
		forged.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "MANAGER_VGPU_CLAIM_UID", Value: string(claimA.UID)}}
		delete(forged.Annotations, "required-plugins.noderesource.dev/container.app")
		createPod(t, forged)
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

	t.Run("7-uninstall-leaves-nothing", func(t *testing.T) {
		deletePod(t, "share-a")
		for _, c := range []string{"share-a", "share-b", "too-big"} {
			_ = kube.ResourceV1().ResourceClaims(testNS).Delete(ctx, c, metav1.DeleteOptions{})
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
		eventually(t, defaultTimeout, "the plugin pod gone", func() (bool, error) {
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
