package driver

import (
	"testing"
	"testing/fstest"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// TestRealWorldVersionsAndTopology: version strings as real drivers report them (the mock's
// hide the leading-zero problem) end up as strict semver, and pcieRoot is published only when
// topology is known.
func TestRealWorldVersionsAndTopology(t *testing.T) {
	g := gpu.Device{
		Index: 3, UUID: "GPU-1", MemoryBytes: 80 << 30, ProductName: "NVIDIA A100-SXM4-80GB",
		Brand: "Nvidia", Architecture: "Ampere", CUDAComputeCapability: "8.0",
		DriverVersion: "535.104.05", CUDADriverVersion: 12020, PCIBusID: "0000:0f:00.0", NUMANode: ptr.To(1),
	}
	d := &Driver{cfg: Config{DriverName: "vgpu.dra.dev", NodeName: "n", VGPU: true}, devices: []gpu.Device{g}, health: newDeviceHealth()}
	d.deps.PCIeRoot = func(busID string) (deviceattribute.DeviceAttribute, error) {
		if busID != "0000:0f:00.0" {
			t.Errorf("pcieRoot asked for %q", busID)
		}
		return deviceattribute.DeviceAttribute{Name: deviceattribute.StandardDeviceAttributePCIeRoot, Value: resourceapi.DeviceAttribute{StringValue: ptr.To("pci0000:00")}}, nil
	}
	dev := d.buildResources(klog.Background()).Pools["n"].Slices[0].Devices[0]
	for name, want := range map[resourceapi.QualifiedName]string{"driverVersion": "535.104.5", "cudaDriverVersion": "12.2.0", "cudaComputeCapability": "8.0.0"} {
		if got := dev.Attributes[name].VersionValue; got == nil || *got != want {
			t.Errorf("%s = %v, want %s", name, got, want)
		}
	}
	if got := dev.Attributes["resource.kubernetes.io/pcieRoot"].StringValue; got == nil || *got != "pci0000:00" {
		t.Errorf("pcieRoot = %v", got)
	}
	if got := dev.Attributes["numaNode"].IntValue; got == nil || *got != 1 {
		t.Errorf("numaNode = %v", got)
	}

	d.deps.PCIeRoot = nil
	g.DriverVersion = "garbage"
	d.devices = []gpu.Device{g}
	dev = d.buildResources(klog.Background()).Pools["n"].Slices[0].Devices[0]
	if _, ok := dev.Attributes["resource.kubernetes.io/pcieRoot"]; ok {
		t.Error("pcieRoot published without topology")
	}
	if _, ok := dev.Attributes["driverVersion"]; ok {
		t.Error("an unparsable driver version was published (the API would reject the slice)")
	}
	if dev.Attributes["uuid"].StringValue == nil {
		t.Error("other attributes lost with the bad version")
	}
}

// TestStandardNUMANodeAttribute: the standard resource.kubernetes.io/numaNode is published next
// to the driver-local numaNode where the kernel knows the GPU's NUMA node, and left out where
// it says none (-1), where the device is not in sysfs and where nothing resolves it; the local
// one stays for the claims that name it. The resolver is the DRA library's, over a fake sysfs.
func TestStandardNUMANodeAttribute(t *testing.T) {
	const busID = "0000:0f:00.0"
	sysfs := func(numaNode string) func(string) (deviceattribute.DeviceAttribute, error) {
		fsys := fstest.MapFS{"bus/pci/devices/" + busID + "/numa_node": {Data: []byte(numaNode + "\n")}}
		return func(id string) (deviceattribute.DeviceAttribute, error) {
			return deviceattribute.GetNUMANodeAttributeByPCIBusID(id, deviceattribute.ScalarAttribute, deviceattribute.WithFS(fsys))
		}
	}
	tests := []struct {
		name      string
		resolve   func(string) (deviceattribute.DeviceAttribute, error)
		busID     string
		local     *int
		wantStd   *int64
		wantLocal *int64
	}{
		{name: "sysfs knows the node", resolve: sysfs("1"), busID: busID, local: ptr.To(1), wantStd: ptr.To[int64](1), wantLocal: ptr.To[int64](1)},
		{name: "node 0 is a node", resolve: sysfs("0"), busID: busID, local: ptr.To(0), wantStd: ptr.To[int64](0), wantLocal: ptr.To[int64](0)},
		{name: "no NUMA affinity (-1)", resolve: sysfs("-1"), busID: busID},
		{name: "device not in sysfs", resolve: sysfs("1"), busID: "0000:10:00.0"},
		{name: "no resolver (simulated without a table)", busID: busID, local: ptr.To(1), wantLocal: ptr.To[int64](1)},
		{name: "no PCI address", resolve: sysfs("1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := gpu.Device{Index: 0, UUID: "GPU-1", MemoryBytes: 80 << 30, CUDAComputeCapability: "8.0", PCIBusID: tt.busID, NUMANode: tt.local}
			d := &Driver{cfg: Config{DriverName: "vgpu.dra.dev", NodeName: "n", VGPU: true}, devices: []gpu.Device{g}, health: newDeviceHealth()}
			d.deps.NUMANode = tt.resolve
			attrs := d.buildResources(klog.Background()).Pools["n"].Slices[0].Devices[0].Attributes
			for name, want := range map[resourceapi.QualifiedName]*int64{deviceattribute.StandardDeviceAttributeNUMANode: tt.wantStd, "numaNode": tt.wantLocal} {
				a, ok := attrs[name]
				switch {
				case want == nil && ok:
					t.Errorf("%s published as %v, want it left out", name, a)
				case want != nil && (a.IntValue == nil || *a.IntValue != *want):
					t.Errorf("%s = %v, want %d", name, a.IntValue, *want)
				}
			}
		})
	}
}
