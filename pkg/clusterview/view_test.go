package clusterview

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

const (
	driver = "vgpu.dra.dev"
	gib    = int64(1) << 30
	h200   = 144384 << 20 // 141Gi
)

func gpuDevice(name, uuid string, taint string) resourceapi.Device {
	d := resourceapi.Device{
		Name: name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"uuid": {StringValue: ptr.To(uuid)}, "productName": {StringValue: ptr.To("NVIDIA H200 141GB HBM3e")},
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: *resource.NewQuantity(h200, resource.BinarySI)},
			"cores":  {Value: *resource.NewQuantity(100, resource.DecimalSI)},
		},
	}
	if taint != "" {
		d.Taints = []resourceapi.DeviceTaint{{Key: driver + "/unhealthy", Value: taint, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	}
	return d
}

func slice(node, drv string, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + drv},
		Spec: resourceapi.ResourceSliceSpec{Driver: drv, NodeName: ptr.To(node),
			Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}, Devices: devices},
	}
}

// claim is allocated on pool/device with the consumed capacity given ("" leaves it out: a
// whole-GPU allocation) and reserved for pods.
func claim(ns, name, drv, pool, device, memory string, cores int64, pods ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name + "-uid")}}
	res := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: drv, Pool: pool, Device: device, ShareID: ptr.To(types.UID("share-" + name))}
	if memory != "" {
		res.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(memory), "cores": *resource.NewQuantity(cores, resource.DecimalSI),
		}
	}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{res}}}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID(p + "-uid")})
	}
	return c
}

// withStatus adds the device status the node's plugin writes for the claim's result (contract
// §3), with the data given as JSON, under the result's share ID, or another one (a stale entry
// that must not count).
func withStatus(c *resourceapi.ResourceClaim, data string, sameShare bool) *resourceapi.ResourceClaim {
	res := c.Status.Allocation.Devices.Results[0]
	share := string(*res.ShareID)
	if !sameShare {
		share = "other-" + share
	}
	c.Status.Devices = append(c.Status.Devices, resourceapi.AllocatedDeviceStatus{Driver: res.Driver, Pool: res.Pool, Device: res.Device,
		ShareID: ptr.To(share), Data: &runtime.RawExtension{Raw: []byte(data)}})
	return c
}

// pod uses the claim through its "gpu" reference: by name, or (template) through its status.
func pod(ns, name, node, claimName string, fromTemplate bool, containers ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node}}
	ref := corev1.PodResourceClaim{Name: "gpu"}
	if fromTemplate {
		ref.ResourceClaimTemplateName = ptr.To("tmpl")
		p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To(claimName)}}
	} else {
		ref.ResourceClaimName = ptr.To(claimName)
	}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{ref}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}})
	}
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "sidecar"})
	return p
}

// cluster: node-a has two H200s (gpu-1 unhealthy), node-b one; two pods share node-a's gpu-0,
// a guaranteed one and a best-effort one that may burst to the whole GPU (their plugin's device
// status says so; share-a's also has a stale entry of another share), a third takes node-b's
// whole, with no device status yet; a claim of another driver and an unallocated claim are
// ignored.
func cluster() *fake.Clientset {
	unallocated := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "pending"}}
	objs := []runtime.Object{
		slice("node-a", driver, gpuDevice("gpu-0", "GPU-a0", ""), gpuDevice("gpu-1", "GPU-a1", "XID-79")),
		slice("node-b", driver, gpuDevice("gpu-0", "GPU-b0", "")),
		slice("node-a", "net.example.com", resourceapi.Device{Name: "eth0"}),
		withStatus(withStatus(claim("team", "share-a", driver, "node-a", "gpu-0", "10Gi", 30, "share-a"),
			`{"class":"BestEffort","coresCeiling":90}`, false), `{"request":"gpu","cores":30,"class":"Guaranteed"}`, true),
		withStatus(claim("team", "share-b-xyz", driver, "node-a", "gpu-0", "20Gi", 25, "share-b"),
			`{"request":"gpu","cores":25,"class":"BestEffort","coresCeiling":100}`, true),
		claim("batch", "whole", driver, "node-b", "gpu-0", "", 0, "trainer"),
		claim("team", "nic", "net.example.com", "node-a", "eth0", "", 0, "share-a"),
		unallocated,
		pod("team", "share-a", "node-a", "share-a", false, "app"),
		pod("team", "share-b", "node-a", "share-b-xyz", true, "app", "helper"),
		pod("batch", "trainer", "node-b", "whole", false, "train"),
		pod("team", "plain", "node-a", "missing", false, "app"),
	}
	return fake.NewClientset(objs...)
}

func TestGPUs(t *testing.T) {
	got, err := Reader{Client: cluster(), Driver: driver}.GPUs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []GPU{
		{Node: "node-a", Pool: "node-a", Device: "gpu-0", UUID: "GPU-a0", Product: "NVIDIA H200 141GB HBM3e",
			Memory: Amount{Published: h200, Allocated: 30 * gib, Free: h200 - 30*gib}, Cores: Amount{Published: 100, Allocated: 55, Free: 45},
			Health: "Healthy", Shares: []Share{
				{Namespace: "team", Claim: "share-a", Request: "gpu", ShareID: "share-share-a", Memory: 10 * gib, Cores: 30, Class: "Guaranteed", Pods: []string{"share-a"}},
				{Namespace: "team", Claim: "share-b-xyz", Request: "gpu", ShareID: "share-share-b-xyz", Memory: 20 * gib, Cores: 25,
					Class: "BestEffort", CoresCeiling: 100, Pods: []string{"share-b"}},
			}},
		{Node: "node-a", Pool: "node-a", Device: "gpu-1", UUID: "GPU-a1", Product: "NVIDIA H200 141GB HBM3e",
			Memory: Amount{Published: h200, Free: h200}, Cores: Amount{Published: 100, Free: 100}, Health: "Unhealthy: XID-79", Shares: []Share{}},
		{Node: "node-b", Pool: "node-b", Device: "gpu-0", UUID: "GPU-b0", Product: "NVIDIA H200 141GB HBM3e",
			Memory: Amount{Published: h200, Allocated: h200}, Cores: Amount{Published: 100, Allocated: 100}, Health: "Healthy",
			Shares: []Share{{Namespace: "batch", Claim: "whole", Request: "gpu", ShareID: "share-whole", Memory: h200, Cores: 100, Pods: []string{"trainer"}}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("GPUs =\n%+v\nwant\n%+v", got, want)
	}
}

func TestPods(t *testing.T) {
	teamA := PodShare{Namespace: "team", Pod: "share-a", Claim: "share-a", Request: "gpu", Node: "node-a", Device: "gpu-0", UUID: "GPU-a0",
		Memory: 10 * gib, Cores: 30, Class: "Guaranteed", Containers: []string{"app"}}
	teamB := PodShare{Namespace: "team", Pod: "share-b", Claim: "share-b-xyz", Request: "gpu", Node: "node-a", Device: "gpu-0", UUID: "GPU-a0",
		Memory: 20 * gib, Cores: 25, Class: "BestEffort", CoresCeiling: 100, Containers: []string{"app", "helper"}}
	batch := PodShare{Namespace: "batch", Pod: "trainer", Claim: "whole", Request: "gpu", Node: "node-b", Device: "gpu-0", UUID: "GPU-b0",
		Memory: h200, Cores: 100, Containers: []string{"train"}}
	tests := []struct {
		namespace string
		want      []PodShare
	}{
		{"team", []PodShare{teamA, teamB}},
		{"batch", []PodShare{batch}},
		{"", []PodShare{batch, teamA, teamB}},
		{"empty", []PodShare{}},
	}
	for _, tc := range tests {
		t.Run("namespace="+tc.namespace, func(t *testing.T) {
			got, err := Reader{Client: cluster(), Driver: driver}.Pods(t.Context(), tc.namespace)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Pods(%q) =\n%+v\nwant\n%+v", tc.namespace, got, tc.want)
			}
		})
	}
}

// TestGPUsWithPartitions: of a MIG-managed GPU's partitions only the one a claim holds is listed,
// with its profile and its GPU's UUID, and the whole GPU then has nothing free for a share.
func TestGPUsWithPartitions(t *testing.T) {
	part := func(name, profile string) resourceapi.Device {
		d := gpuDevice(name, "", "")
		delete(d.Attributes, "uuid")
		d.Attributes["parentUUID"] = resourceapi.DeviceAttribute{StringValue: ptr.To("GPU-a0")}
		d.Attributes["migProfile"] = resourceapi.DeviceAttribute{StringValue: ptr.To(profile)}
		d.Capacity["memory"] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(18*gib, resource.BinarySI)}
		return d
	}
	kube := fake.NewClientset(
		slice("node-a", driver, gpuDevice("gpu-0", "GPU-a0", ""), part("gpu-0-mig-1g-18gb-0", "1g.18gb"), part("gpu-0-mig-1g-18gb-1", "1g.18gb")),
		claim("team", "small", driver, "node-a", "gpu-0-mig-1g-18gb-1", "4Gi", 50, "p"),
	)
	got, err := Reader{Client: kube, Driver: driver}.GPUs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Device != "gpu-0" || got[1].Device != "gpu-0-mig-1g-18gb-1" {
		t.Fatalf("GPUs %+v: want gpu-0 and the held partition only", got)
	}
	if got[0].Memory.Free != 0 || got[0].Cores.Free != 0 {
		t.Errorf("the partitioned GPU shows %+v and %+v free", got[0].Memory, got[0].Cores)
	}
	if p := got[1]; p.MIGProfile != "1g.18gb" || p.UUID != "GPU-a0" || p.Memory.Free != 14*gib || p.Cores.Free != 50 {
		t.Errorf("partition %+v", p)
	}
}
