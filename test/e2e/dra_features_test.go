//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The DRA features of issue 12 on the real cluster, with two simulated H200s, in a namespace of
// their own that allows admin access. They run on one install, in order, and leave nothing
// behind: TestVGPU installs the chart again for its own scenarios.
const (
	featNS = "vgpu-e2e-dra"
	// h200MiB is a simulated H200's memory, which the fake libcuda in the workload is told.
	h200MiB = 144384
)

func TestDRAFeatures(t *testing.T) {
	ctx := context.Background()
	// The reconciliation every 5 s, so that the stale-claim case below needs no 5-minute wait.
	installChart(t, "--set", "deviceSource=simulated:dgx-h200:2", "--set", "reconcileInterval=5s")
	ensureFeatureNamespace(t)
	defer cleanupFeatures(t)
	node := nodeName(t)
	gpus := simulatedGPUs(t, 2)

	// Every example of deployments/examples, applied and run as a user would, one at a time.
	t.Run("examples", func(t *testing.T) {
		runExamples(t, gpus)
	})

	// A pod that asked through the extended resource, on a GPU that fails and recovers: the
	// Warning event and the claim's Healthy condition, then the recovery (health_test.go). Both
	// GPUs are still free: the pod takes one whole.
	t.Run("health-on-the-extended-resource-path", func(t *testing.T) {
		healthOnTheExtendedResourcePath(t, gpus)
	})

	// Two tenants share gpu-0 (15Gi and 30 % each) while a monitoring pod with admin access
	// reaches the same GPU without a share: all three run at once.
	var shareClaim *resourceapi.ResourceClaim
	t.Run("admin-access-next-to-two-shares", func(t *testing.T) {
		shareClaim = createFeatClaim(t, pinnedClaim("share-1", "15Gi", 30, 0))
		createFeatClaim(t, pinnedClaim("share-2", "15Gi", 30, 0))
		mon := pinnedClaim("monitor", "256Mi", 1, 0)
		mon.Spec.Devices.Requests[0].Exactly.AdminAccess = ptrTo(true)
		createFeatClaim(t, mon)
		for _, name := range []string{"share-1", "share-2", "monitor"} {
			createFeatPod(t, featPod(name, map[string]string{"app": name}))
		}
		for _, name := range []string{"share-1", "share-2", "monitor"} {
			waitFeatRunning(t, name)
		}
		for _, name := range []string{"share-1", "share-2", "monitor"} {
			if p, _ := kube.CoreV1().Pods(featNS).Get(ctx, name, metav1.GetOptions{}); p.Status.Phase != corev1.PodRunning {
				t.Errorf("%s is %s while the others run", name, p.Status.Phase)
			}
		}
		if cfg := featExec(t, "monitor", "app", "cat /etc/vgpu-dra/config/vgpu.config"); !strings.Contains(cfg, "gpu 0 "+gpus[0]+" 0 0\n") {
			t.Errorf("monitor's vgpu.config has limits:\n%s", cfg)
		}
		if m := featExec(t, "monitor", "app", "cat /proc/self/mounts"); strings.Contains(m, "/tmp/.vmem_node") || !strings.Contains(m, "/etc/vgpu-dra/config") {
			t.Errorf("monitor's mounts: want the config directory and no ledger directory:\n%s", m)
		}
		// The library passes the monitor through; a tenant is held to its 15Gi.
		probe := fmt.Sprintf(`FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:%d" vgpu_probe alloc 20480 2>/dev/null; echo "exit $?"`, h200MiB)
		for pod, want := range map[string]string{"monitor": "alloc 20480 MiB = 0\nexit 0\n", "share-1": "alloc 20480 MiB = 2\nexit 0\n"} {
			if out := featExec(t, pod, "app", probe); !strings.HasSuffix(out, want) {
				t.Errorf("%s: 20Gi allocation printed %q, want it to end with %q", pod, out, want)
			}
		}
	})

	t.Run("claim-device-status", func(t *testing.T) {
		st := waitReady(t, "share-1")
		data := statusData(t, st)
		if data["gpuUUID"] != gpus[0] || data["memory"] != "15Gi" || data["cores"] != float64(30) || data["path"] != "nri" || data["request"] != "gpu" {
			t.Errorf("share-1 status data %v", data)
		}
		if st.Pool != node || st.Device != "gpu-0" || st.ShareID == nil {
			t.Errorf("share-1 status entry %s/%s share %v, want this node's gpu-0 share", st.Pool, st.Device, st.ShareID)
		}
		if d := statusData(t, waitReady(t, "monitor")); d["adminAccess"] != true || d["memory"] != nil {
			t.Errorf("monitor status data %v, want admin access without limits", d)
		}
		out, _ := run(t, "kubectl", "get", "resourceclaim", "-n", featNS, "share-1", "-o", "jsonpath={.status.devices}")
		t.Logf("kubectl get resourceclaim share-1 -o jsonpath={.status.devices}: %s", out)
	})

	t.Run("device-status-only-from-its-own-node", func(t *testing.T) {
		checkStatusWriters(t, shareClaim, node)
	})

	// gpu-0 has 141Gi, 30Gi of it in shares (the monitor takes none): 120Gi does not fit.
	t.Run("prioritized-list-takes-the-second-choice", func(t *testing.T) {
		c := pinnedClaim("fallback", "", 0, 0)
		pin := c.Spec.Devices.Requests[0].Exactly.Selectors
		sub := func(name, memory string, cores int64) resourceapi.DeviceSubRequest {
			return resourceapi.DeviceSubRequest{Name: name, DeviceClassName: driverName, Selectors: pin,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					"memory": resource.MustParse(memory), "cores": *resource.NewQuantity(cores, resource.DecimalSI)}}}
		}
		c.Spec.Devices.Requests[0] = resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
			sub("big", "120Gi", 50), sub("small", "10Gi", 20)}}
		createFeatClaim(t, c)
		p := featPod("fallback", map[string]string{"app": "fallback"})
		p.Spec.Containers[0].Resources.Claims[0].Request = "gpu" // the parent request
		createFeatPod(t, p)
		waitFeatRunning(t, "fallback")
		got, err := kube.ResourceV1().ResourceClaims(featNS).Get(ctx, "fallback", metav1.GetOptions{})
		if err != nil || got.Status.Allocation == nil || got.Status.Allocation.Devices.Results[0].Request != "gpu/small" {
			t.Fatalf("allocation %+v (%v), want gpu/small", got.Status.Allocation, err)
		}
		if env := featEnv(t, "fallback", "app"); env["CUDA_MEM_LIMIT_0"] != "10240m" || env["CUDA_CORE_LIMIT_0"] != "20" {
			t.Errorf("env limits %q %q, want the second choice's 10240m and 20", env["CUDA_MEM_LIMIT_0"], env["CUDA_CORE_LIMIT_0"])
		}
		if cfg := featExec(t, "fallback", "app", "cat /etc/vgpu-dra/config/vgpu.config"); !strings.Contains(cfg, " 10737418240 20\n") {
			t.Errorf("vgpu.config:\n%s\nwant 10Gi and 20 %%", cfg)
		}
		if d := statusData(t, waitReady(t, "fallback")); d["request"] != "gpu/small" || d["memory"] != "10Gi" {
			t.Errorf("status data %v, want the sub-request and its 10Gi", d)
		}
	})

	// Two containers, each with a claim of two shares on two GPUs of one NUMA node: each sees
	// both GPUs with its own claim's limits.
	t.Run("two-shares-on-two-gpus-of-one-numa-node", func(t *testing.T) {
		createFeatClaim(t, twoGPUClaim("pair-a", "8Gi", "4Gi"))
		createFeatClaim(t, twoGPUClaim("pair-b", "6Gi", "2Gi"))
		p := featPod("pair", map[string]string{"a": "pair-a", "b": "pair-b"})
		createFeatPod(t, p)
		waitFeatRunning(t, "pair")
		for ctr, want := range map[string][2]int64{"a": {8 << 30, 4 << 30}, "b": {6 << 30, 2 << 30}} {
			cfg := featExec(t, "pair", ctr, "cat /etc/vgpu-dra/config/vgpu.config")
			lines := gpuLines(cfg)
			if len(lines) != 2 || lines[0][1] == lines[1][1] {
				t.Errorf("container %s: gpu lines %v, want two different GPUs\n%s", ctr, lines, cfg)
				continue
			}
			got := map[string]bool{lines[0][2]: true, lines[1][2]: true}
			if !got[fmt.Sprint(want[0])] || !got[fmt.Sprint(want[1])] {
				t.Errorf("container %s: memory limits %v, want %d and %d", ctr, got, want[0], want[1])
			}
		}
	})

	// gpu-1 runs a pod; an XID makes it unhealthy (tainted, the pod's status says so), the
	// recovery action back to none makes it healthy again.
	t.Run("health-cycle", func(t *testing.T) {
		createFeatClaim(t, pinnedClaim("watched", "4Gi", 10, 1))
		createFeatPod(t, featPod("watched", map[string]string{"app": "watched"}))
		waitFeatRunning(t, "watched")
		waitDeviceHealth(t, "watched", "gpu-1", "Healthy")

		controlPOST(t, "/gpus/"+gpus[1]+"/xid/92")
		taint := waitTaint(t, "gpu-1", true)
		if taint.Key != driverName+"/unhealthy" || taint.Effect != resourceapi.DeviceTaintEffectNoSchedule {
			t.Errorf("taint %+v, want %s/unhealthy NoSchedule for XID 92", taint, driverName)
		}
		waitDeviceHealth(t, "watched", "gpu-1", "Unhealthy")

		controlPOST(t, "/gpus/"+gpus[1]+"/recovery-action/1") // a reset is needed
		controlPOST(t, "/gpus/"+gpus[1]+"/recovery-action/0") // and done
		waitTaint(t, "gpu-1", false)
		waitDeviceHealth(t, "watched", "gpu-1", "Healthy")
		if p, _ := kube.CoreV1().Pods(featNS).Get(ctx, "watched", metav1.GetOptions{}); p.Status.Phase != corev1.PodRunning {
			t.Errorf("the pod on the GPU is %s after a NoSchedule fault", p.Status.Phase)
		}
	})

	// A tenant strips its claim's finalizer and deletes it while its pod runs. The scheduler
	// then sees gpu-1's 100Gi as free and allocates another tenant's 100Gi there; the node must
	// not hand out memory the running pod still holds: the plugin keeps the stale claim
	// prepared (event on the pod), the newcomer's Prepare is refused as overcommitted, and once
	// the first pod is gone the newcomer runs.
	t.Run("deleted-claim-keeps-its-capacity-while-its-pod-runs", func(t *testing.T) {
		createFeatClaim(t, pinnedClaim("held", "100Gi", 20, 1))
		createFeatPod(t, featPod("held", map[string]string{"app": "held"}))
		waitFeatRunning(t, "held")
		claims := kube.ResourceV1().ResourceClaims(featNS)
		c, err := claims.Get(ctx, "held", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.Finalizers = nil
		if _, err := claims.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("strip the claim's finalizer: %v", err)
		}
		if err := claims.Delete(ctx, "held", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPluginEvent(t, "held", "VGPUStaleClaimInUse", "still runs")

		createFeatClaim(t, pinnedClaim("next", "100Gi", 20, 1))
		createFeatPod(t, featPod("next", map[string]string{"app": "next"}))
		eventually(t, defaultTimeout, "the newcomer's Prepare refused as overcommitted", func() (bool, error) {
			l, err := kube.CoreV1().Events(featNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=next"})
			if err != nil {
				return false, err
			}
			for _, e := range l.Items {
				if strings.Contains(e.Message, "overcommitted") {
					t.Logf("event on next: %s %s", e.Reason, e.Message)
					return true, nil
				}
			}
			return false, fmt.Errorf("%d events on next, none naming overcommitted", len(l.Items))
		})
		if p, _ := kube.CoreV1().Pods(featNS).Get(ctx, "next", metav1.GetOptions{}); p.Status.Phase == corev1.PodRunning {
			t.Fatal("the newcomer runs with memory the first pod still holds")
		}
		if out := featExec(t, "held", "app", "cat /etc/vgpu-dra/config/vgpu.config"); !strings.Contains(out, " 107374182400 20\n") {
			t.Errorf("the running pod's vgpu.config changed:\n%s", out)
		}

		zero := metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)}
		if err := kube.CoreV1().Pods(featNS).Delete(ctx, "held", zero); err != nil {
			t.Fatal(err)
		}
		waitFeatRunning(t, "next")
	})
}

// waitPluginEvent waits for the kubelet plugin's Warning event with this reason on the pod.
func waitPluginEvent(t *testing.T, pod, reason, text string) {
	t.Helper()
	waitPluginEventOfType(t, featNS, pod, corev1.EventTypeWarning, reason, text)
}

// pinnedClaim asks for a share of the GPU with the given NVML index (memory "" for no capacity).
func pinnedClaim(name, memory string, cores int64, index int) *resourceapi.ResourceClaim {
	c := claimFor(name, "1Gi", 1)
	c.Namespace = featNS
	r := c.Spec.Devices.Requests[0].Exactly
	if memory == "" {
		r.Capacity = nil
	} else {
		r.Capacity.Requests["memory"] = resource.MustParse(memory)
		r.Capacity.Requests["cores"] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	r.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: fmt.Sprintf(`device.attributes["%s"].index == %d`, driverName, index)}}}
	return c
}

// twoGPUClaim asks for two shares on two different GPUs of one NUMA node, by the deprecated
// driver-local numaNode: the claims written before the standard name existed keep working
// (multi-gpu.yaml uses the standard resource.kubernetes.io/numaNode).
func twoGPUClaim(name, first, second string) *resourceapi.ResourceClaim {
	req := func(reqName, memory string) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: reqName, Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: driverName,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
				"memory": resource.MustParse(memory), "cores": *resource.NewQuantity(10, resource.DecimalSI)}},
		}}
	}
	both := []string{"first", "second"}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: featNS},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{req("first", first), req("second", second)},
			Constraints: []resourceapi.DeviceConstraint{
				{Requests: both, DistinctAttribute: ptrTo(resourceapi.FullyQualifiedName(driverName + "/uuid"))},
				{Requests: both, MatchAttribute: ptrTo(resourceapi.FullyQualifiedName(driverName + "/numaNode"))},
			},
		}},
	}
}

// featPod runs the test workload with one container per entry of claims (container → claim).
func featPod(name string, claims map[string]string) *corev1.Pod {
	p := vgpuPod(name, "")
	p.Namespace = featNS
	p.Annotations = map[string]string{}
	p.Spec.Containers = nil
	for ctr, claim := range claims {
		p.Annotations["required-plugins.noderesource.dev/container."+ctr] = `["` + driverName + `"]`
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
			Name: ctr, Image: workloadImage, ImagePullPolicy: corev1.PullNever,
			Command:   []string{"sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"},
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: claim}}},
		})
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: claim, ResourceClaimName: ptrTo(claim)})
	}
	return p
}

// gpuLines returns the fields of the gpu lines of a vgpu.config.
func gpuLines(cfg string) [][]string {
	var out [][]string
	for _, l := range strings.Split(cfg, "\n") {
		if f := strings.Fields(l); len(f) == 5 && f[0] == "gpu" {
			out = append(out, f[1:])
		}
	}
	return out
}

// waitReady waits for the claim's status entry of this driver with Ready=True.
func waitReady(t *testing.T, claim string) resourceapi.AllocatedDeviceStatus {
	t.Helper()
	var st resourceapi.AllocatedDeviceStatus
	eventually(t, defaultTimeout, "claim "+claim+" Ready in status.devices", func() (bool, error) {
		c, err := kube.ResourceV1().ResourceClaims(featNS).Get(context.Background(), claim, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, d := range c.Status.Devices {
			// Ready first; Healthy follows it (contract §3).
			if d.Driver == driverName && len(d.Conditions) > 0 && d.Conditions[0].Type == "Ready" && d.Conditions[0].Status == metav1.ConditionTrue {
				st = d
				return true, nil
			}
		}
		return false, fmt.Errorf("status.devices %+v", c.Status.Devices)
	})
	return st
}

func statusData(t *testing.T, st resourceapi.AllocatedDeviceStatus) map[string]any {
	t.Helper()
	var data map[string]any
	if st.Data == nil || json.Unmarshal(st.Data.Raw, &data) != nil {
		t.Fatalf("status entry without data: %+v", st)
	}
	return data
}

// waitDeviceHealth waits until the pod's container reports the device's health (status
// allocatedResourcesStatus, filled by the kubelet from the plugin's health stream). The kubelet
// names a device by its first CDI device, the result's own: "<driver>/claim=<uid>-<request>-<device>-<share>".
func waitDeviceHealth(t *testing.T, pod, device, health string) {
	t.Helper()
	waitDeviceHealthIn(t, featNS, pod, device, health)
}

// waitDeviceHealthIn is waitDeviceHealth for a pod of namespace ns.
func waitDeviceHealthIn(t *testing.T, ns, pod, device, health string) {
	t.Helper()
	eventually(t, defaultTimeout, fmt.Sprintf("pod %s to show %s %s", pod, device, health), func() (bool, error) {
		p, err := kube.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, err
		}
		for _, rs := range p.Status.ContainerStatuses[0].AllocatedResourcesStatus {
			for _, r := range rs.Resources {
				if strings.Contains(string(r.ResourceID), "-"+device+"-") && string(r.Health) == health {
					return true, nil
				}
			}
		}
		return false, fmt.Errorf("allocatedResourcesStatus %+v", p.Status.ContainerStatuses[0].AllocatedResourcesStatus)
	})
}

// waitTaint waits until the device is tainted (or not) in the node's ResourceSlice.
func waitTaint(t *testing.T, device string, tainted bool) resourceapi.DeviceTaint {
	t.Helper()
	var taint resourceapi.DeviceTaint
	eventually(t, defaultTimeout, fmt.Sprintf("%s tainted=%v in the ResourceSlice", device, tainted), func() (bool, error) {
		list, err := kube.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=" + driverName})
		if err != nil || len(list.Items) == 0 {
			return false, err
		}
		for _, d := range list.Items[0].Spec.Devices {
			if d.Name == device {
				if len(d.Taints) > 0 {
					taint = d.Taints[0]
				}
				return (len(d.Taints) > 0) == tainted, fmt.Errorf("taints %+v", d.Taints)
			}
		}
		return false, fmt.Errorf("no device %s", device)
	})
	return taint
}

func createFeatClaim(t *testing.T, c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	t.Helper()
	out, err := kube.ResourceV1().ResourceClaims(featNS).Create(context.Background(), c, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim %s: %v", c.Name, err)
	}
	return out
}

func createFeatPod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := kube.CoreV1().Pods(featNS).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
}

func waitFeatRunning(t *testing.T, name string) {
	t.Helper()
	eventually(t, defaultTimeout, "pod "+name+" Running", func() (bool, error) {
		p, err := kube.CoreV1().Pods(featNS).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod %s failed: %+v", name, p.Status)
		}
		return p.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s %v %v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
	})
}

func featExec(t *testing.T, pod, ctr, script string) string {
	t.Helper()
	return mustRun(t, "kubectl", "exec", "-n", featNS, pod, "-c", ctr, "--", "sh", "-c", script)
}

func featEnv(t *testing.T, pod, ctr string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(featExec(t, pod, ctr, "env"), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out
}

// ensureFeatureNamespace creates the namespace, labelled so that admin access is allowed there.
func ensureFeatureNamespace(t *testing.T) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: featNS, Labels: map[string]string{resourceapi.DRAAdminNamespaceLabelKey: "true"}}}
	if _, err := kube.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}
