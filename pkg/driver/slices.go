package driver

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// Capacity request policy of contract §2 (the webhook checks requests against the same values).
const (
	memoryMinimum  = contract.MemoryMinimum
	memoryStep     = contract.MemoryStep
	coresTotal     = contract.CoresTotal
	attributeType  = "vgpu"
	deviceNameBase = "gpu-"
)

// DeviceName is the published name of the GPU with this NVML index (contract §2).
func DeviceName(index int) string { return fmt.Sprintf("%s%d", deviceNameBase, index) }

// publishedMemory is the memory capacity a GPU is published with: total minus the reserve.
func publishedMemory(d gpu.Device, reserve int64) int64 {
	total := int64(d.MemoryBytes)
	if reserve >= total {
		return 0
	}
	return total - reserve
}

// buildResources describes every GPU of the node as one device of the pool named after the node,
// in one slice; with MIG-managed GPUs, their partitions and counter sets too (mig.go).
func (d *Driver) buildResources(logger klog.Logger) resourceslice.DriverResources {
	var slices []resourceslice.Slice
	if len(d.deps.MIGLayouts) == 0 {
		devices := make([]resourceapi.Device, 0, len(d.devices))
		for _, g := range d.devices {
			devices = append(devices, d.buildDevice(logger, g))
		}
		slices = []resourceslice.Slice{{Devices: devices}}
	} else {
		for _, part := range d.buildMIGResources(logger) {
			slices = append(slices, resourceslice.Slice{Devices: part.devices, SharedCounters: part.counters})
		}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.cfg.NodeName: {Slices: slices},
	}}
}

// buildDevice describes a whole GPU; on a MIG-managed GPU it consumes all of the GPU's counters.
func (d *Driver) buildDevice(logger klog.Logger, g gpu.Device) resourceapi.Device {
	dev := resourceapi.Device{
		Name:       DeviceName(g.Index),
		Attributes: d.attributes(logger, g),
	}
	d.fillCapacity(&dev, publishedMemory(g, d.cfg.MemoryReserve))
	if l, ok := d.deps.MIGLayouts[g.UUID]; ok {
		dev.ConsumesCounters = wholeGPUConsumption(g, l)
	}
	d.fillTaints(&dev, g)
	return dev
}

// fillCapacity gives dev its memory and cores, shareable with VGPUSupport.
func (d *Driver) fillCapacity(dev *resourceapi.Device, memory int64) {
	dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
	memCap := resourceapi.DeviceCapacity{Value: *resource.NewQuantity(memory, resource.BinarySI)}
	coreCap := resourceapi.DeviceCapacity{Value: *resource.NewQuantity(coresTotal, resource.DecimalSI)}
	if d.cfg.VGPU {
		dev.AllowMultipleAllocations = ptr.To(true)
		// Default and max are rounded down to the step: the API rejects a policy whose
		// default or max is not min + n*step.
		top := memoryMinimum + (memory-memoryMinimum)/memoryStep*memoryStep
		if memory < memoryMinimum {
			top = memoryMinimum // the GPU cannot satisfy any request; the scheduler sees that
		}
		memCap.RequestPolicy = &resourceapi.CapacityRequestPolicy{
			Default: resource.NewQuantity(top, resource.BinarySI),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{
				Min:  resource.NewQuantity(memoryMinimum, resource.BinarySI),
				Max:  resource.NewQuantity(top, resource.BinarySI),
				Step: resource.NewQuantity(memoryStep, resource.BinarySI),
			},
		}
		coreCap.RequestPolicy = &resourceapi.CapacityRequestPolicy{
			Default: resource.NewQuantity(coresTotal, resource.DecimalSI),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{
				Min:  resource.NewQuantity(contract.CoresMinimum, resource.DecimalSI),
				Max:  resource.NewQuantity(coresTotal, resource.DecimalSI),
				Step: resource.NewQuantity(1, resource.DecimalSI),
			},
		}
	}
	dev.Capacity[contract.CapacityMemory] = memCap
	dev.Capacity[contract.CapacityCores] = coreCap
}

// fillTaints taints dev while its GPU is unhealthy.
func (d *Driver) fillTaints(dev *resourceapi.Device, g gpu.Device) {
	if h, unhealthy := d.health.unhealthy(g.UUID); unhealthy {
		effect := resourceapi.DeviceTaintEffectNoSchedule
		if h.Fatal {
			effect = resourceapi.DeviceTaintEffectNoExecute
		}
		dev.Taints = []resourceapi.DeviceTaint{{
			Key:    d.cfg.DriverName + "/" + contract.UnhealthyTaintKeySuffix,
			Value:  taintValue(h),
			Effect: effect,
		}}
	}
}

func (d *Driver) attributes(logger klog.Logger, g gpu.Device) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(s)} }
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"type":                 str(attributeType),
		contract.AttributeUUID: str(g.UUID),
		"index":                {IntValue: ptr.To(int64(g.Index))},
		"productName":          str(g.ProductName),
		"brand":                str(g.Brand),
		"architecture":         str(g.Architecture),
	}
	addVersion := func(name resourceapi.QualifiedName, v string, err error) {
		if err != nil {
			logger.Error(err, "Leaving out a version attribute the API would reject", "device", DeviceName(g.Index), "attribute", name)
			return
		}
		attrs[name] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
	}
	v, err := semverFromDotted(g.CUDAComputeCapability)
	addVersion("cudaComputeCapability", v, err)
	v, err = semverFromDotted(g.DriverVersion)
	addVersion("driverVersion", v, err)
	v, err = semverFromCUDA(g.CUDADriverVersion)
	addVersion("cudaDriverVersion", v, err)
	// The driver-local numaNode is deprecated in favour of the standard one below (contract
	// §2); it stays for the claims and constraints that name it.
	if g.NUMANode != nil {
		attrs["numaNode"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(*g.NUMANode))}
	}
	addStandard := func(what string, resolve func(string) (deviceattribute.DeviceAttribute, error)) {
		if g.PCIBusID == "" || resolve == nil {
			return
		}
		if a, err := resolve(g.PCIBusID); err == nil {
			attrs[a.Name] = a.Value
		} else {
			logger.V(4).Info("No "+what+" attribute", "device", DeviceName(g.Index), "err", err)
		}
	}
	addStandard("PCIe root", d.deps.PCIeRoot)
	addStandard("standard NUMA node", d.deps.NUMANode)
	return attrs
}

// taintValue turns a health event into a label value (≤63 chars, alphanumerics, '-', '_', '.').
func taintValue(h gpu.HealthEvent) string {
	out := make([]byte, 0, len(h.Reason))
	for _, c := range []byte(h.Reason) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
			out = append(out, c)
		case c == ' ' || c == ':':
			out = append(out, '-')
		}
	}
	for len(out) > 0 && !isAlnum(out[0]) {
		out = out[1:]
	}
	if len(out) > 63 {
		out = out[:63]
	}
	for len(out) > 0 && !isAlnum(out[len(out)-1]) {
		out = out[:len(out)-1]
	}
	return string(out)
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
