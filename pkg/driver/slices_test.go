package driver

import (
	"testing"

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
