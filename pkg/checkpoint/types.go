package checkpoint

import (
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// State is where a claim stands in Prepare's state machine. Prepare records a claim once, as
// PrepareCompleted, when everything is in place; a crash before that leaves files of a claim
// the checkpoint does not know, which start-up removes (contract §7). Plugins before issue 18
// recorded PrepareStarted first, before any host resource existed: such a record, left by
// their crash, is still read and rolled back by start-up recovery.
type State string

const (
	// PrepareStarted: Prepare began; directories or the CDI spec may exist in part. Written
	// by earlier versions only.
	PrepareStarted State = "PrepareStarted"
	// PrepareCompleted: everything Prepare creates exists and the kubelet was answered.
	PrepareCompleted State = "PrepareCompleted"
)

// Data is the content of the checkpoint (contract §7, the "data" value).
type Data struct {
	// BootID is the node's boot ID when the checkpoint was written; a different one at
	// start-up means the node rebooted (tmpfs state such as CDI specs is gone).
	BootID string `json:"bootID"`
	// Claims are the prepared claims, keyed by claim UID.
	Claims map[string]Claim `json:"claims"`
}

// Claim is one prepared (or half-prepared) ResourceClaim.
type Claim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	State     State  `json:"state"`
	// Path says how the claim's containers get their directories; it never changes after
	// Prepare records it, not even across restarts.
	Path contract.ClaimPath `json:"path"`
	// ReservedFor are the UIDs of the pods the claim is reserved for.
	ReservedFor []string `json:"reservedFor"`
	// RegisterUUID is the per-claim path's registration UUID; empty on the NRI path.
	RegisterUUID string   `json:"registerUUID"`
	Devices      []Device `json:"devices"`
}

// Device is one allocation result of a claim, with what Prepare made of it.
type Device struct {
	Request string `json:"request"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	// ShareID is the allocation's share ID when the device allows multiple allocations.
	ShareID string `json:"shareID"`
	GPUUUID string `json:"gpuUUID"`
	// Index is the GPU's NVML index.
	Index int `json:"index"`
	// MemoryBytes and Cores are the consumed capacity; 0 means the whole GPU.
	MemoryBytes  int64    `json:"memoryBytes"`
	Cores        int64    `json:"cores"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	// AdminAccess marks a result of an adminAccess request: no limits (MemoryBytes and Cores
	// are 0), not counted against the GPU's capacity. Format v2 (omitted when false, so that
	// a checkpoint without such a device stays a v1 file).
	AdminAccess bool `json:"adminAccess,omitempty"`
	// Class is the share's class from its VGPUConfig (pkg/api/v1alpha1): "Guaranteed" or
	// "BestEffort"; empty (a device prepared before classes existed) reads as Guaranteed.
	// CoresCeiling is the percent the share may burst to; 0 means no burst (the ceiling is
	// Cores). Both are omitted when empty, so files without them keep their format version:
	// an older reader ignores them and serves the share at its request, never above it.
	Class        string `json:"class,omitempty"`
	CoresCeiling int64  `json:"coresCeiling,omitempty"`
	// MIG is the MIG instance of a result on a MIG partition (contract §18), created before
	// the record is written; the zero value for a whole GPU, and then omitted, so that files
	// without partitions keep their format.
	MIG MIGInstance `json:"mig,omitzero"`
}

// MIGInstance is the MIG instance a partition's result runs on: the profile and placement
// that the device name stands for, and what NVML made of them. GPUUUID is the Device's.
type MIGInstance struct {
	Profile           string `json:"profile"`
	ProfileID         int    `json:"profileID"`
	Start             int    `json:"start"`
	Size              int    `json:"size"`
	GPUInstanceID     int    `json:"gpuInstanceID"`
	ComputeInstanceID int    `json:"computeInstanceID"`
	// UUID is the MIG device's, "MIG-…": what the container is given instead of the GPU's.
	UUID string `json:"uuid"`
}

// IsMIG says the result is on a MIG partition.
func (d Device) IsMIG() bool { return d.MIG.Profile != "" }

// CapacityKey names what the result takes capacity of: its GPU, or the partition of its GPU
// (partitions and whole-GPU shares never share a GPU; the scheduler's counters see to that).
func (d Device) CapacityKey() string {
	if d.IsMIG() {
		return d.GPUUUID + "/" + d.Device
	}
	return d.GPUUUID
}

// VisibleUUID is the UUID the container is given: the MIG device's on a partition.
func (d Device) VisibleUUID() string {
	if d.IsMIG() {
		return d.MIG.UUID
	}
	return d.GPUUUID
}

// classBestEffort is Device.Class of a best-effort share (pkg/api/v1alpha1's BestEffort).
const classBestEffort = "BestEffort"

// BestEffort says the share is best-effort; any other class, empty included, is Guaranteed.
func (d Device) BestEffort() bool { return d.Class == classBestEffort }

// Ceiling is what the share may burst to, percent (contract §16): its CoresCeiling; without one,
// its Cores for a guaranteed share (no burst) and the whole GPU for a best-effort one, which
// exists to use what the others leave idle. Meaningful only for a share with Cores.
func (d Device) Ceiling() int64 {
	switch {
	case d.CoresCeiling > 0:
		return max(d.CoresCeiling, d.Cores)
	case d.BestEffort():
		return 100
	}
	return d.Cores
}

// DeepCopy returns a copy of d that shares no memory with it; nil maps and slices stay nil.
// It runs once per mutation in a batch (see the package documentation), so it allocates one
// backing array for all strings and one for all devices rather than a few per claim.
func (d Data) DeepCopy() Data {
	out := Data{BootID: d.BootID}
	if d.Claims == nil {
		return out
	}
	var a arena
	for _, c := range d.Claims {
		a.reserve(c)
	}
	a.alloc()
	out.Claims = make(map[string]Claim, len(d.Claims))
	for uid, c := range d.Claims {
		out.Claims[uid] = a.claim(c)
	}
	return out
}

// DeepCopy returns a copy of c that shares no memory with it; nil slices stay nil.
func (c Claim) DeepCopy() Claim {
	var a arena
	a.reserve(c)
	a.alloc()
	return a.claim(c)
}

// arena hands out the slices of a deep copy from two shared backing arrays. Every slice it
// returns has its capacity capped at its length, so an append to one reallocates instead of
// overwriting its neighbour.
type arena struct {
	nStrings, nDevices int
	strings            []string
	devices            []Device
}

// reserve counts the elements that copying c will take.
func (a *arena) reserve(c Claim) {
	a.nStrings += len(c.ReservedFor)
	a.nDevices += len(c.Devices)
	for _, dev := range c.Devices {
		a.nStrings += len(dev.CDIDeviceIDs)
	}
}

// alloc allocates what reserve counted.
func (a *arena) alloc() {
	a.strings = make([]string, 0, a.nStrings)
	a.devices = make([]Device, 0, a.nDevices)
}

func (a *arena) claim(c Claim) Claim {
	c.ReservedFor = a.stringSlice(c.ReservedFor)
	if c.Devices != nil {
		start := len(a.devices)
		for _, dev := range c.Devices {
			dev.CDIDeviceIDs = a.stringSlice(dev.CDIDeviceIDs)
			a.devices = append(a.devices, dev)
		}
		c.Devices = a.devices[start:len(a.devices):len(a.devices)]
	}
	return c
}

func (a *arena) stringSlice(s []string) []string {
	if s == nil {
		return nil
	}
	start := len(a.strings)
	a.strings = append(a.strings, s...)
	return a.strings[start:len(a.strings):len(a.strings)]
}
