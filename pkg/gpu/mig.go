package gpu

import (
	"errors"
	"fmt"
	"slices"
)

// MIG partitions a GPU into hardware instances (NVIDIA Multi-Instance GPU). The plugin creates
// and destroys them at Prepare and Unprepare (contract §18); both the real and the simulated
// source implement it over the same NVML code (mig_nvml.go).
type MIG interface {
	// MIGLayout says what the GPU with this UUID can be split into; ErrMIGNotSupported when
	// it cannot (not MIG-capable, or NVML does not answer while MIG mode is off).
	MIGLayout(uuid string) (MIGLayout, error)
	// MIGMode returns the GPU's current and pending MIG mode (pending differs from current
	// while a change waits for a GPU reset).
	MIGMode(uuid string) (current, pending bool, err error)
	// SetMIGMode turns MIG mode on or off. ErrMIGResetNeeded when the change is only pending:
	// the GPU needs a reset (its processes stopped) before it takes effect.
	SetMIGMode(uuid string, enabled bool) error
	// MIGInstances lists the GPU instances that exist on the GPU, with their compute instance.
	MIGInstances(uuid string) ([]MIGInstance, error)
	// CreateMIGInstance creates a GPU instance of the profile at the placement and one compute
	// instance spanning it. ErrMIGPlacementTaken when the placement overlaps an instance or the
	// GPU has no room left for the profile.
	CreateMIGInstance(uuid string, profileID int, at MIGPlacement) (MIGInstance, error)
	// DestroyMIGInstance destroys the GPU instance with this ID and its compute instances; a
	// GPU instance that does not exist is not an error.
	DestroyMIGInstance(uuid string, gpuInstanceID int) error
}

var (
	// ErrMIGNotSupported: the GPU offers no MIG profiles.
	ErrMIGNotSupported = errors.New("GPU does not support MIG")
	// ErrMIGResetNeeded: a MIG mode change is pending until the GPU is reset.
	ErrMIGResetNeeded = errors.New("MIG mode change needs a GPU reset")
	// ErrMIGPlacementTaken: the placement is in use, or the GPU has no room for the profile.
	ErrMIGPlacementTaken = errors.New("MIG placement is taken")
)

// MIGPlacement is where a GPU instance sits: Size memory slots from Start (NVML's
// GpuInstancePlacement).
type MIGPlacement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// Overlaps says whether two placements share a slot.
func (p MIGPlacement) Overlaps(o MIGPlacement) bool {
	return p.Start < o.Start+o.Size && o.Start < p.Start+p.Size
}

// MIGProfile is one GPU instance profile (NVML's GpuInstanceProfileInfo).
type MIGProfile struct {
	// ID is NVML's GPU_INSTANCE_PROFILE_* value.
	ID int
	// Name is NVIDIA's name of the profile, e.g. "1g.18gb" or "1g.18gb+me".
	Name string
	// Slices is the number of compute slices (SliceCount).
	Slices int
	// MemoryBytes is the instance's memory.
	MemoryBytes uint64
	// Multiprocessors is the number of SMs of an instance.
	Multiprocessors int
	// Instances is how many instances of the profile the GPU holds at once (InstanceCount).
	Instances int
	// Placements are where an instance of the profile may be created.
	Placements []MIGPlacement
}

// MIGLayout is everything a MIG-capable GPU can be split into.
type MIGLayout struct {
	// Profiles are sorted by compute slices, then memory, then ID.
	Profiles []MIGProfile
	// Slots is the number of memory slots placements are counted in (the largest Start+Size).
	Slots int
	// Slices is the whole GPU's compute slices, MemoryBytes its memory in MIG mode: the
	// largest profile's.
	Slices      int
	MemoryBytes uint64
}

// Profile returns the profile with this ID.
func (l MIGLayout) Profile(id int) (MIGProfile, bool) {
	i := slices.IndexFunc(l.Profiles, func(p MIGProfile) bool { return p.ID == id })
	if i < 0 {
		return MIGProfile{}, false
	}
	return l.Profiles[i], true
}

// MIGInstance is a GPU instance with the compute instance that spans it.
type MIGInstance struct {
	GPUUUID           string       `json:"gpuUUID"`
	ProfileID         int          `json:"profileID"`
	Placement         MIGPlacement `json:"placement"`
	GPUInstanceID     int          `json:"gpuInstanceID"`
	ComputeInstanceID int          `json:"computeInstanceID"`
	// UUID is the MIG device's UUID, "MIG-…", what a container is given; empty when the
	// GPU instance has no compute instance.
	UUID string `json:"uuid"`
}

// migProfileSuffix names the variants of a profile that NVIDIA's names tell apart.
var migProfileSuffix = map[int]string{
	7:  "+me",     // GPU_INSTANCE_PROFILE_1_SLICE_REV1: with the media extensions
	8:  "+me",     // GPU_INSTANCE_PROFILE_2_SLICE_REV1
	10: "+gfx",    // GPU_INSTANCE_PROFILE_1_SLICE_GFX
	11: "+gfx",    // GPU_INSTANCE_PROFILE_2_SLICE_GFX
	12: "+gfx",    // GPU_INSTANCE_PROFILE_4_SLICE_GFX
	13: "-me",     // GPU_INSTANCE_PROFILE_1_SLICE_NO_ME
	14: "-me",     // GPU_INSTANCE_PROFILE_2_SLICE_NO_ME
	15: "+me.all", // GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME
	16: "+me.all", // GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME
	17: "+gfx",    // GPU_INSTANCE_PROFILE_3_SLICE_GFX
}

// migProfileName is NVIDIA's name of a profile: compute slices, memory in GB rounded up (as
// nvidia-smi prints them: 4864 MiB is 1g.5gb on an A100 40GB), and the variant's suffix.
func migProfileName(id, slices int, memoryMiB uint64) string {
	return fmt.Sprintf("%dg.%dgb%s", slices, (memoryMiB+1023)/1024, migProfileSuffix[id])
}

// newMIGLayout sorts the profiles and derives the GPU's totals from them.
func newMIGLayout(profiles []MIGProfile) (MIGLayout, error) {
	if len(profiles) == 0 {
		return MIGLayout{}, ErrMIGNotSupported
	}
	slices.SortFunc(profiles, func(a, b MIGProfile) int {
		switch {
		case a.Slices != b.Slices:
			return a.Slices - b.Slices
		case a.MemoryBytes != b.MemoryBytes:
			if a.MemoryBytes < b.MemoryBytes {
				return -1
			}
			return 1
		}
		return a.ID - b.ID
	})
	var l MIGLayout
	l.Profiles = profiles
	for _, p := range profiles {
		for _, at := range p.Placements {
			l.Slots = max(l.Slots, at.Start+at.Size)
		}
		l.Slices = max(l.Slices, p.Slices)
		l.MemoryBytes = max(l.MemoryBytes, p.MemoryBytes)
	}
	return l, nil
}
