package gpu

import (
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

var _ MIG = (*nvmlSource)(nil)

// handle opens the GPU with this UUID.
func (s *nvmlSource) handle(uuid string) (nvml.Device, error) {
	dev, ret := s.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("open GPU %s: %w", uuid, ret)
	}
	return dev, nil
}

// MIGLayout reads every GPU instance profile NVML offers for the GPU, with its placements.
func (s *nvmlSource) MIGLayout(uuid string) (MIGLayout, error) {
	dev, err := s.handle(uuid)
	if err != nil {
		return MIGLayout{}, err
	}
	var profiles []MIGProfile
	for id := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(id)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_FUNCTION_NOT_FOUND:
			continue // the GPU has no such profile (or none at all)
		default:
			return MIGLayout{}, fmt.Errorf("read MIG profile %d of GPU %s: %w", id, uuid, ret)
		}
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return MIGLayout{}, fmt.Errorf("read the placements of MIG profile %d of GPU %s: %w", id, uuid, ret)
		}
		p := MIGProfile{
			ID: int(info.Id), Name: migProfileName(int(info.Id), int(info.SliceCount), info.MemorySizeMB),
			Slices: int(info.SliceCount), MemoryBytes: info.MemorySizeMB << 20,
			Multiprocessors: int(info.MultiprocessorCount), Instances: int(info.InstanceCount),
		}
		for _, at := range placements {
			p.Placements = append(p.Placements, MIGPlacement{Start: int(at.Start), Size: int(at.Size)})
		}
		profiles = append(profiles, p)
	}
	l, err := newMIGLayout(profiles)
	if err != nil {
		return MIGLayout{}, fmt.Errorf("GPU %s: %w", uuid, err)
	}
	return l, nil
}

// MIGMode reads the current and the pending mode.
func (s *nvmlSource) MIGMode(uuid string) (current, pending bool, err error) {
	dev, err := s.handle(uuid)
	if err != nil {
		return false, false, err
	}
	cur, pend, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return false, false, fmt.Errorf("read MIG mode of GPU %s: %w", uuid, ret)
	}
	return cur == nvml.DEVICE_MIG_ENABLE, pend == nvml.DEVICE_MIG_ENABLE, nil
}

// SetMIGMode asks for the mode and checks that it took effect.
func (s *nvmlSource) SetMIGMode(uuid string, enabled bool) error {
	dev, err := s.handle(uuid)
	if err != nil {
		return err
	}
	mode, word := nvml.DEVICE_MIG_DISABLE, "off"
	if enabled {
		mode, word = nvml.DEVICE_MIG_ENABLE, "on"
	}
	activation, ret := dev.SetMigMode(mode)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("turn MIG mode %s on GPU %s: %w", word, uuid, ret)
	}
	cur, _, err := s.MIGMode(uuid)
	if err != nil {
		return err
	}
	if cur != enabled {
		return fmt.Errorf("turn MIG mode %s on GPU %s: %w (activation: %v)", word, uuid, ErrMIGResetNeeded, activation)
	}
	return nil
}

// MIGInstances lists the GPU instances of every profile with their first compute instance.
func (s *nvmlSource) MIGInstances(uuid string) ([]MIGInstance, error) {
	dev, err := s.handle(uuid)
	if err != nil {
		return nil, err
	}
	migUUIDs, err := migDeviceUUIDs(dev)
	if err != nil {
		return nil, fmt.Errorf("GPU %s: %w", uuid, err)
	}
	gis, err := gpuInstances(dev, uuid)
	if err != nil {
		return nil, err
	}
	var out []MIGInstance
	for _, gi := range gis {
		in, err := describeInstance(uuid, gi, migUUIDs)
		if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	slices.SortFunc(out, func(a, b MIGInstance) int { return a.Placement.Start - b.Placement.Start })
	return out, nil
}

// migDeviceUUIDs maps GPU instance ID and compute instance ID to the MIG device's UUID.
func migDeviceUUIDs(dev nvml.Device) (map[[2]int]string, error) {
	n, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count MIG devices: %w", ret)
	}
	out := map[[2]int]string{}
	for i := range n {
		mig, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // no MIG device at this index
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("open MIG device %d: %w", i, ret)
		}
		gi, ret1 := mig.GetGpuInstanceId()
		ci, ret2 := mig.GetComputeInstanceId()
		id, ret3 := mig.GetUUID()
		if err := errors.Join(nvmlErr(ret1), nvmlErr(ret2), nvmlErr(ret3)); err != nil {
			return nil, fmt.Errorf("read MIG device %d: %w", i, err)
		}
		out[[2]int{gi, ci}] = id
	}
	return out, nil
}

func nvmlErr(ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return ret
}

// describeInstance reads a GPU instance and its first compute instance.
func describeInstance(uuid string, gi nvml.GpuInstance, migUUIDs map[[2]int]string) (MIGInstance, error) {
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return MIGInstance{}, fmt.Errorf("read a MIG instance of GPU %s: %w", uuid, ret)
	}
	in := MIGInstance{
		GPUUUID: uuid, ProfileID: int(info.ProfileId), GPUInstanceID: int(info.Id), ComputeInstanceID: -1,
		Placement: MIGPlacement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)},
	}
	cis, err := computeInstances(gi)
	if err != nil {
		return MIGInstance{}, fmt.Errorf("GPU %s, MIG instance %d: %w", uuid, in.GPUInstanceID, err)
	}
	for _, ci := range cis {
		ciInfo, ret := ci.GetInfo()
		if ret != nvml.SUCCESS {
			return MIGInstance{}, fmt.Errorf("read a compute instance of GPU %s, MIG instance %d: %w", uuid, in.GPUInstanceID, ret)
		}
		if in.ComputeInstanceID < 0 || int(ciInfo.Id) < in.ComputeInstanceID {
			in.ComputeInstanceID = int(ciInfo.Id)
		}
	}
	in.UUID = migUUIDs[[2]int{in.GPUInstanceID, in.ComputeInstanceID}]
	return in, nil
}

// gpuInstances lists the GPU instances of every profile of the GPU.
func gpuInstances(dev nvml.Device, uuid string) ([]nvml.GpuInstance, error) {
	var out []nvml.GpuInstance
	for id := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(id)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := dev.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("list the MIG instances of profile %d on GPU %s: %w", id, uuid, ret)
		}
		out = append(out, gis...)
	}
	return out, nil
}

// computeInstances lists the compute instances of every compute profile of a GPU instance.
func computeInstances(gi nvml.GpuInstance) ([]nvml.ComputeInstance, error) {
	var out []nvml.ComputeInstance
	for id := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		cis, ret := gi.GetComputeInstances(&info)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("list compute instances of profile %d: %w", id, ret)
		}
		out = append(out, cis...)
	}
	return out, nil
}

// CreateMIGInstance creates the GPU instance at the placement and one compute instance of all
// its slices. A compute instance that cannot be created takes the GPU instance with it.
func (s *nvmlSource) CreateMIGInstance(uuid string, profileID int, at MIGPlacement) (MIGInstance, error) {
	dev, err := s.handle(uuid)
	if err != nil {
		return MIGInstance{}, err
	}
	info, ret := dev.GetGpuInstanceProfileInfo(profileID)
	if ret != nvml.SUCCESS {
		return MIGInstance{}, fmt.Errorf("read MIG profile %d of GPU %s: %w", profileID, uuid, ret)
	}
	placement := nvml.GpuInstancePlacement{Start: uint32(at.Start), Size: uint32(at.Size)}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &placement)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_INSUFFICIENT_RESOURCES, nvml.ERROR_IN_USE:
		return MIGInstance{}, fmt.Errorf("create a MIG instance of profile %d at slot %d on GPU %s: %w (%w)", profileID, at.Start, uuid, ErrMIGPlacementTaken, ret)
	default:
		return MIGInstance{}, fmt.Errorf("create a MIG instance of profile %d at slot %d on GPU %s: %w", profileID, at.Start, uuid, ret)
	}
	ciInfo, err := wholeComputeProfile(gi, int(info.SliceCount))
	if err == nil {
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
			err = fmt.Errorf("create its compute instance: %w", ret)
		}
	}
	if err != nil {
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			err = errors.Join(err, fmt.Errorf("destroy the GPU instance again: %w", ret))
		}
		return MIGInstance{}, fmt.Errorf("MIG instance of profile %d at slot %d on GPU %s: %w", profileID, at.Start, uuid, err)
	}
	migUUIDs, err := migDeviceUUIDs(dev)
	if err != nil {
		return MIGInstance{}, fmt.Errorf("GPU %s: %w", uuid, err)
	}
	return describeInstance(uuid, gi, migUUIDs)
}

// wholeComputeProfile finds the compute instance profile that spans all slices of the GPU
// instance.
func wholeComputeProfile(gi nvml.GpuInstance, giSlices int) (nvml.ComputeInstanceProfileInfo, error) {
	for id := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && int(info.SliceCount) == giSlices {
			return info, nil
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, fmt.Errorf("no compute instance profile of %d slices", giSlices)
}

// DestroyMIGInstance destroys the GPU instance's compute instances, then the GPU instance.
func (s *nvmlSource) DestroyMIGInstance(uuid string, gpuInstanceID int) error {
	dev, err := s.handle(uuid)
	if err != nil {
		return err
	}
	gis, err := gpuInstances(dev, uuid)
	if err != nil {
		return err
	}
	for _, gi := range gis {
		giInfo, ret := gi.GetInfo()
		if ret != nvml.SUCCESS || int(giInfo.Id) != gpuInstanceID {
			continue
		}
		cis, err := computeInstances(gi)
		if err != nil {
			return fmt.Errorf("GPU %s, MIG instance %d: %w", uuid, gpuInstanceID, err)
		}
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != nvml.SUCCESS {
				return fmt.Errorf("destroy a compute instance of MIG instance %d on GPU %s: %w", gpuInstanceID, uuid, ret)
			}
		}
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			return fmt.Errorf("destroy MIG instance %d on GPU %s: %w", gpuInstanceID, uuid, ret)
		}
		return nil
	}
	return nil
}
