package driver

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// MIG partitions beside shares (contract §18). A MIG-managed GPU publishes, besides its
// whole-GPU device gpu-<i>, one device per MIG profile and placement. All of them consume the
// counters of the GPU's counter set: one per memory slot, the compute slices, the memory, and
// an instance count for a profile that cannot fill all its placements at once. The whole-GPU
// device consumes all of them, so the scheduler never places a share and a partition on one
// GPU at the same time; it allows multiple allocations, and Kubernetes 1.37 charges the
// counters of such a device once, for its first allocation, so shares among themselves are
// counted by their capacity alone. A partition may be shared the same way.

const (
	attributeTypeMIG = "mig"
	// maxDevicesWithCounters is the API's limit on the devices of a slice in which a device
	// consumes counters (or has taints).
	maxDevicesWithCounters = 64
	// maxCounterSetsPerSlice is the API's limit on a slice's counter sets.
	maxCounterSetsPerSlice = 8
	counterComputeSlices   = "compute-slices"
	counterMemory          = "memory"
)

// migDevice is one MIG profile at one placement of a MIG-managed GPU.
type migDevice struct {
	gpu     gpu.Device
	layout  gpu.MIGLayout
	profile gpu.MIGProfile
	at      gpu.MIGPlacement
}

// MIGDeviceName is the published name of a MIG profile at a placement of the GPU with this
// NVML index: gpu-0-mig-1g-18gb-0 (the profile's '.' and '+' as '-', then the first slot).
func MIGDeviceName(index int, profile string, start int) string {
	p := strings.NewReplacer(".", "-", "+", "-").Replace(profile)
	return fmt.Sprintf("%s%d-mig-%s-%d", deviceNameBase, index, p, start)
}

// counterSetName names the counter set of the GPU with this index.
func counterSetName(index int) string { return fmt.Sprintf("%s%d-counters", deviceNameBase, index) }

func slotCounter(slot int) string { return fmt.Sprintf("slot-%d", slot) }

func instancesCounter(profileID int) string { return fmt.Sprintf("profile-%d-instances", profileID) }

// limitedProfile says whether a profile has more placements than instances at once: it then
// has a counter of its own.
func limitedProfile(p gpu.MIGProfile) bool { return p.Instances < len(p.Placements) }

// migDevicesOf lists a MIG-managed GPU's partitions, in profile and placement order.
func migDevicesOf(g gpu.Device, l gpu.MIGLayout) []migDevice {
	var out []migDevice
	for _, p := range l.Profiles {
		for _, at := range p.Placements {
			out = append(out, migDevice{gpu: g, layout: l, profile: p, at: at})
		}
	}
	return out
}

// counterSet is what a MIG-managed GPU has to give.
func counterSet(g gpu.Device, l gpu.MIGLayout) resourceapi.CounterSet {
	c := map[string]resourceapi.Counter{
		counterComputeSlices: {Value: *resource.NewQuantity(int64(l.Slices), resource.DecimalSI)},
		counterMemory:        {Value: *resource.NewQuantity(int64(l.MemoryBytes), resource.BinarySI)},
	}
	for s := range l.Slots {
		c[slotCounter(s)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	}
	for _, p := range l.Profiles {
		if limitedProfile(p) {
			c[instancesCounter(p.ID)] = resourceapi.Counter{Value: *resource.NewQuantity(int64(p.Instances), resource.DecimalSI)}
		}
	}
	return resourceapi.CounterSet{Name: counterSetName(g.Index), Counters: c}
}

// wholeGPUConsumption takes every counter of the GPU's set but the profiles' instance counts,
// which nothing else can reach once the slots are taken.
func wholeGPUConsumption(g gpu.Device, l gpu.MIGLayout) []resourceapi.DeviceCounterConsumption {
	set := counterSet(g, l)
	for _, p := range l.Profiles {
		delete(set.Counters, instancesCounter(p.ID))
	}
	return []resourceapi.DeviceCounterConsumption{{CounterSet: set.Name, Counters: set.Counters}}
}

// consumption is what the partition takes of its GPU's counters.
func (m migDevice) consumption() []resourceapi.DeviceCounterConsumption {
	c := map[string]resourceapi.Counter{
		counterComputeSlices: {Value: *resource.NewQuantity(int64(m.profile.Slices), resource.DecimalSI)},
		counterMemory:        {Value: *resource.NewQuantity(int64(m.profile.MemoryBytes), resource.BinarySI)},
	}
	for s := m.at.Start; s < m.at.Start+m.at.Size; s++ {
		c[slotCounter(s)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	}
	if limitedProfile(m.profile) {
		c[instancesCounter(m.profile.ID)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	}
	return []resourceapi.DeviceCounterConsumption{{CounterSet: counterSetName(m.gpu.Index), Counters: c}}
}

// deviceMemory is the memory a published device has to give: a partition's, or the GPU's less
// the reserve.
func (d *Driver) deviceMemory(name string) int64 {
	if m, ok := d.migByName[name]; ok {
		return int64(m.profile.MemoryBytes)
	}
	return publishedMemory(d.byName[name], d.cfg.MemoryReserve)
}

// buildMIGDevice describes one partition: the GPU's attributes (but its UUID, which is the
// parent's, as parentUUID), the profile and the placement; the partition's memory and all of its
// SMs as capacity, shareable like a whole GPU.
func (d *Driver) buildMIGDevice(logger klog.Logger, m migDevice) resourceapi.Device {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(s)} }
	num := func(n int) resourceapi.DeviceAttribute {
		return resourceapi.DeviceAttribute{IntValue: ptr.To(int64(n))}
	}
	name := MIGDeviceName(m.gpu.Index, m.profile.Name, m.at.Start)
	attrs := d.attributes(logger, m.gpu)
	delete(attrs, "uuid")
	attrs["type"] = str(attributeTypeMIG)
	attrs["parentUUID"] = str(m.gpu.UUID)
	attrs["migProfile"] = str(m.profile.Name)
	attrs["migSlot"] = num(m.at.Start)
	attrs["multiprocessors"] = num(m.profile.Multiprocessors)
	dev := resourceapi.Device{Name: name, Attributes: attrs, ConsumesCounters: m.consumption()}
	d.fillCapacity(&dev, int64(m.profile.MemoryBytes))
	d.fillTaints(&dev, m.gpu)
	return dev
}

// buildMIGResources lays the pool out in slices: the counter sets first (at most eight a
// slice), then the devices, a GPU's together, at most 64 a slice.
func (d *Driver) buildMIGResources(logger klog.Logger) []sliceParts {
	var sets []resourceapi.CounterSet
	var perGPU [][]resourceapi.Device
	for _, g := range d.devices {
		devs := []resourceapi.Device{d.buildDevice(logger, g)}
		if l, ok := d.deps.MIGLayouts[g.UUID]; ok {
			sets = append(sets, counterSet(g, l))
			for _, m := range migDevicesOf(g, l) {
				devs = append(devs, d.buildMIGDevice(logger, m))
			}
		}
		perGPU = append(perGPU, devs)
	}
	var out []sliceParts
	for chunk := range slices.Chunk(sets, maxCounterSetsPerSlice) {
		out = append(out, sliceParts{counters: chunk})
	}
	var cur []resourceapi.Device
	for _, devs := range perGPU {
		if len(cur)+len(devs) > maxDevicesWithCounters && len(cur) > 0 {
			out = append(out, sliceParts{devices: cur})
			cur = nil
		}
		cur = append(cur, devs...)
	}
	if len(cur) > 0 {
		out = append(out, sliceParts{devices: cur})
	}
	return out
}

// sliceParts is one slice's content: counter sets or devices, never both (the API's rule).
type sliceParts struct {
	counters []resourceapi.CounterSet
	devices  []resourceapi.Device
}
