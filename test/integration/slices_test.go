package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
)

// waitSlice waits until the fake API server holds this node's ResourceSlice and cond holds.
func (n *node) waitSlice(cond func(resourceapi.ResourceSlice) bool) resourceapi.ResourceSlice {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		list, err := n.kube.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			n.t.Fatal(err)
		}
		for _, s := range list.Items {
			if s.Spec.Driver == driverName && s.Spec.NodeName != nil && *s.Spec.NodeName == nodeName && cond(s) {
				return s
			}
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("no matching ResourceSlice for node %s; have %d slices", nodeName, len(list.Items))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestResourceSliceContent(t *testing.T) {
	n := newNode(t, func(c *plugin.Config) { c.MemoryReserve = 1 << 30 })
	n.start()
	s := n.waitSlice(func(resourceapi.ResourceSlice) bool { return true })
	if s.Spec.Pool.Name != nodeName {
		t.Errorf("pool %q, want the node name", s.Spec.Pool.Name)
	}
	if len(s.Spec.Devices) != 2 || s.Spec.Devices[0].Name != "gpu-0" || s.Spec.Devices[1].Name != "gpu-1" {
		t.Fatalf("devices = %v, want gpu-0 and gpu-1", s.Spec.Devices)
	}
	devs, _ := n.gpus.Devices(t.Context())
	d := s.Spec.Devices[1]
	if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
		t.Error("device not shareable (allowMultipleAllocations)")
	}
	str := func(name string) string {
		a, ok := d.Attributes[resourceapi.QualifiedName(name)]
		if !ok || a.StringValue == nil {
			t.Errorf("attribute %s missing", name)
			return ""
		}
		return *a.StringValue
	}
	ver := func(name string) string {
		a, ok := d.Attributes[resourceapi.QualifiedName(name)]
		if !ok || a.VersionValue == nil {
			t.Errorf("version attribute %s missing", name)
			return ""
		}
		return *a.VersionValue
	}
	if got := str("uuid"); got != devs[1].UUID {
		t.Errorf("uuid %q, want %q", got, devs[1].UUID)
	}
	if str("type") != "vgpu" || !strings.Contains(str("productName"), "H200") || str("architecture") != "Hopper" {
		t.Errorf("type/product/arch = %q %q %q", str("type"), str("productName"), str("architecture"))
	}
	if idx := d.Attributes["index"].IntValue; idx == nil || *idx != 1 {
		t.Errorf("index attribute = %v", idx)
	}
	for name, want := range map[string]string{"driverVersion": "550.54.15", "cudaDriverVersion": "12.4.0", "cudaComputeCapability": "9.0.0"} {
		if got := ver(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if d.Attributes["numaNode"].IntValue == nil {
		t.Error("numaNode missing for a simulated GPU with a NUMA node")
	}
	// The standard name carries the same node as the deprecated local one, from the simulated
	// source's table: the examples constrain on it.
	for _, dev := range s.Spec.Devices {
		std, local := dev.Attributes["resource.kubernetes.io/numaNode"].IntValue, dev.Attributes["numaNode"].IntValue
		if std == nil || local == nil || *std != *local {
			t.Errorf("%s: resource.kubernetes.io/numaNode %v, want the local numaNode %v", dev.Name, std, local)
		}
	}
	for _, dev := range s.Spec.Devices {
		if _, ok := dev.Attributes["resource.kubernetes.io/pcieRoot"]; ok {
			t.Errorf("simulated %s has a pcieRoot: its made-up PCI address was resolved in this host's sysfs", dev.Name)
		}
	}

	mem := d.Capacity["memory"]
	wantMem := int64(devs[1].MemoryBytes) - 1<<30
	if mem.Value.Value() != wantMem {
		t.Errorf("memory capacity %s, want total minus 1Gi reserve = %d", mem.Value.String(), wantMem)
	}
	p := mem.RequestPolicy
	if p == nil || p.ValidRange == nil {
		t.Fatal("memory has no request policy")
	}
	mib := int64(1 << 20)
	if p.Default.Value() != wantMem/mib*mib || p.ValidRange.Max.Value() != wantMem/mib*mib {
		t.Errorf("memory default %s max %s, want the capacity rounded down to 1Mi", p.Default, p.ValidRange.Max)
	}
	if !p.ValidRange.Min.Equal(resource.MustParse("256Mi")) || !p.ValidRange.Step.Equal(resource.MustParse("1Mi")) {
		t.Errorf("memory min %s step %s, want 256Mi and 1Mi", p.ValidRange.Min, p.ValidRange.Step)
	}
	cores := d.Capacity["cores"]
	if cores.Value.Value() != 100 || cores.RequestPolicy.Default.Value() != 100 ||
		cores.RequestPolicy.ValidRange.Min.Value() != 1 || cores.RequestPolicy.ValidRange.Max.Value() != 100 || cores.RequestPolicy.ValidRange.Step.Value() != 1 {
		t.Errorf("cores capacity/policy = %+v", cores)
	}
	if got := gaugeValue(t, n, "vgpu_dra_published_devices"); got != 2 {
		t.Errorf("published_devices = %v", got)
	}
}

func TestVGPUOffPublishesExclusiveGPUs(t *testing.T) {
	n := newNode(t, func(c *plugin.Config) { c.VGPU, c.NRI = false, false })
	n.start()
	s := n.waitSlice(func(resourceapi.ResourceSlice) bool { return true })
	for _, d := range s.Spec.Devices {
		if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
			t.Errorf("%s shareable with VGPUSupport off", d.Name)
		}
		for name, c := range d.Capacity {
			if c.RequestPolicy != nil {
				t.Errorf("%s capacity %s has a request policy with VGPUSupport off", d.Name, name)
			}
		}
	}
}

// TestUnhealthyGPU: an XID taints the device in the slice, Prepare refuses it, the kubelet's
// health stream reports it, and recovery clears all three.
func TestUnhealthyGPU(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	devs, _ := n.gpus.Devices(t.Context())

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := drahealth.NewDRAResourceHealthClient(k.conn).NodeWatchResources(ctx, &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Devices) != 2 {
		t.Fatalf("first health report covers %d devices, want all 2", len(first.Devices))
	}
	for _, d := range first.Devices {
		if d.Health != drahealth.HealthStatus_HEALTHY {
			t.Errorf("%s initially %v", d.Device.DeviceName, d.Health)
		}
	}

	if err := n.gpus.SetHealth(devs[0].UUID, false, 79); err != nil {
		t.Fatal(err)
	}
	s := n.waitSlice(func(s resourceapi.ResourceSlice) bool { return len(s.Spec.Devices[0].Taints) == 1 })
	taint := s.Spec.Devices[0].Taints[0]
	if taint.Key != driverName+"/unhealthy" || taint.Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Errorf("taint = %+v, want %s/unhealthy NoExecute for XID 79", taint, driverName)
	}
	if len(s.Spec.Devices[1].Taints) != 0 {
		t.Error("healthy gpu-1 is tainted")
	}
	report, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Devices) != 1 || report.Devices[0].Device.DeviceName != "gpu-0" || report.Devices[0].Health != drahealth.HealthStatus_UNHEALTHY {
		t.Errorf("change report = %v, want gpu-0 unhealthy only", report.Devices)
	}
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "1Gi", cores: 10, shareID: shareA})
	if r := k.prepare(t, a)[string(a.UID)]; !strings.Contains(r.Error, "unhealthy") || !strings.Contains(r.Error, "gpu-0") {
		t.Errorf("prepare on an unhealthy GPU: %q", r.Error)
	}

	if err := n.gpus.SetHealth(devs[0].UUID, true, 0); err != nil {
		t.Fatal(err)
	}
	n.waitSlice(func(s resourceapi.ResourceSlice) bool { return len(s.Spec.Devices[0].Taints) == 0 })
	if r := k.prepare(t, a)[string(a.UID)]; r.Error != "" {
		t.Errorf("prepare after recovery: %s", r.Error)
	}
}
