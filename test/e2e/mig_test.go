//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// TestMIG: MIG partitions beside shares on one node (contract §18), with two simulated H200s
// and GPU 0 MIG-managed. The example's pods get partitions of GPU 0, each container given its
// MIG device; shares of GPU 1 run beside them; a share of GPU 0 waits, unschedulable, while the
// partitions hold it, and is placed once they are gone — the GPU out of MIG mode then.
func TestMIG(t *testing.T) {
	ctx := context.Background()
	installChart(t, "--set", "deviceSource=simulated:dgx-h200:2", "--set", "mig.gpus=0")
	gpus := simulatedGPUs(t, 2)
	ns := "vgpu-e2e-ex-mig"
	pods := applyExample(t, filepath.Join(repoRoot, "deployments", "examples", "mig", "mig-partitions.yaml"), ns)
	for _, p := range pods {
		waitRunningIn(t, ns, p, defaultTimeout)
	}

	partitions := map[string]bool{}
	claims, err := kube.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims.Items {
		data := deviceStatusOf(t, c)
		dev := c.Status.Allocation.Devices.Results[0].Device
		if !strings.HasPrefix(dev, "gpu-0-mig-") || !strings.HasPrefix(data.MIGUUID, "MIG-") || data.GPUUUID != gpus[0] {
			t.Errorf("claim %s: device %s, status %+v; want a partition of GPU 0 with its MIG device", c.Name, dev, data)
		}
		partitions[dev] = true
		pod := c.Status.ReservedFor[0].Name
		cfg := mustRun(t, "kubectl", "exec", "-n", ns, pod, "-c", "app", "--", "cat", "/etc/vgpu-dra/config/vgpu.config")
		if !strings.Contains(cfg, "gpu 0 "+data.MIGUUID+" ") {
			t.Errorf("%s's vgpu.config does not name its MIG device %s:\n%s", pod, data.MIGUUID, cfg)
		}
		// A share of a partition is held to its 8Gi inside the partition's 35Gi (the fake
		// libcuda in the image plays the MIG device the container is given).
		if data.MIGProfile == "2g.35gb" {
			probe := `FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:35840" vgpu_probe alloc 6144 4096 2>/dev/null; echo "exit $?"`
			out := mustRun(t, "kubectl", "exec", "-n", ns, pod, "-c", "app", "--", "sh", "-c", probe)
			if !strings.HasSuffix(out, "alloc 6144 MiB = 0\nalloc 4096 MiB = 2\nexit 0\n") {
				t.Errorf("%s: 6Gi then 4Gi more in its 8Gi share of a partition printed %q, want the second refused", pod, out)
			}
		}
	}
	if n := len(migInstances(t, gpus[0])); n != len(partitions) {
		t.Errorf("GPU 0 has %d MIG instances for the %d partitions allocated (%v)", n, len(partitions), partitions)
	}

	beside := pinnedIn(ns, "share-gpu-1", 1)
	waiting := pinnedIn(ns, "share-gpu-0", 0)
	for _, c := range []*resourceapi.ResourceClaim{beside, waiting} {
		if _, err := kube.ResourceV1().ResourceClaims(ns).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := cluster.VGPUPod(ns, c.Name, c.Name)
		if _, err := kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitRunningIn(t, ns, beside.Name, defaultTimeout)
	eventually(t, defaultTimeout, "the scheduler to report share-gpu-0 unschedulable beside GPU 0's partitions", func() (bool, error) {
		pod, err := kube.CoreV1().Pods(ns).Get(ctx, waiting.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				t.Logf("share-gpu-0 pending: %s", c.Message)
				return true, nil
			}
		}
		return false, nil
	})

	// The partitions go: their instances with them, and GPU 0 takes the share.
	zero := metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)}
	for _, p := range pods {
		if err := kube.CoreV1().Pods(ns).Delete(ctx, p, zero); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, defaultTimeout, "GPU 0's MIG instances destroyed with their claims", func() (bool, error) {
		n := len(migInstances(t, gpus[0]))
		return n == 0, nil
	})
	start := time.Now()
	waitRunningIn(t, ns, waiting.Name, 6*time.Minute)
	t.Logf("share-gpu-0 scheduled %v after the partitions went", time.Since(start).Round(100*time.Millisecond))
	if on := migModeOn(t, gpus[0]); on {
		t.Error("GPU 0 is still in MIG mode with a whole-GPU share prepared on it")
	}
}

// pinnedIn is a claim of namespace ns for a 1Gi, 10 % share of the whole GPU with this index.
func pinnedIn(ns, name string, index int) *resourceapi.ResourceClaim {
	c := cluster.ClaimFor(ns, name, "1Gi", 10)
	c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: fmt.Sprintf(`device.attributes[%q].type == "vgpu" && device.attributes[%q].index == %d`, driverName, driverName, index)}}}
	return c
}

// deviceStatusOf is the data of the claim's first device status.
func deviceStatusOf(t *testing.T, c resourceapi.ResourceClaim) contract.DeviceStatusData {
	t.Helper()
	var data contract.DeviceStatusData
	if len(c.Status.Devices) == 0 || c.Status.Devices[0].Data == nil {
		t.Fatalf("claim %s has no device status", c.Name)
	}
	mustUnmarshal(t, c.Status.Devices[0].Data.Raw, &data)
	return data
}

// simulatedMIG is the simulated GPUs' MIG state file (pkg/gpu), the node's "hardware".
type simulatedMIG struct {
	GPUs map[string]struct {
		MIGMode   bool              `json:"migMode"`
		Instances []json.RawMessage `json:"instances"`
	} `json:"gpus"`
}

func readSimulatedMIG(t *testing.T) simulatedMIG {
	t.Helper()
	var st simulatedMIG
	b, err := os.ReadFile(filepath.Join(cluster.StateDir, "simulated-mig.json"))
	if err != nil {
		t.Fatalf("the simulated GPUs' MIG state: %v", err)
	}
	mustUnmarshal(t, b, &st)
	return st
}

func migInstances(t *testing.T, uuid string) []json.RawMessage {
	return readSimulatedMIG(t).GPUs[uuid].Instances
}

func migModeOn(t *testing.T, uuid string) bool { return readSimulatedMIG(t).GPUs[uuid].MIGMode }
