package gpu

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/vgpu-dra/vgpu-dra/pkg/fsutil"
)

// The simulated GPUs' MIG is go-nvml's mock made to behave like the hardware where the plugin
// depends on it: a placement that overlaps an instance, a profile past its instance count or
// memory past the GPU's is refused (ERROR_INSUFFICIENT_RESOURCES); a GPU instance with compute
// instances is not destroyed (ERROR_IN_USE), nor MIG mode turned off under instances; MIG devices
// have handles with UUIDs. And the instances outlive the plugin, as on a GPU: with a state file
// (SetMIGStateFile) every change is written there before NVML answers, and a new process finds
// the GPUs as the last one left them — what the crash tests need.

var _ MIG = (*Simulated)(nil)

// simMIG is the simulated GPUs' MIG state.
type simMIG struct {
	mu   sync.Mutex
	path string // the state file; "" keeps it in memory only
	// pending holds the mode asked for on a GPU whose change waits for a reset
	// (SetMIGResetNeeded); absent: a change takes effect at once.
	resetNeeded map[*server.Device]bool
	pending     map[*server.Device]int
}

// simMIGState is the state file's content.
type simMIGState struct {
	GPUs map[string]simMIGGPU `json:"gpus"`
}

type simMIGGPU struct {
	MIGMode   bool             `json:"migMode"`
	Instances []simMIGInstance `json:"instances,omitempty"`
}

type simMIGInstance struct {
	ProfileID     int          `json:"profileID"`
	Placement     MIGPlacement `json:"placement"`
	GPUInstanceID int          `json:"gpuInstanceID"`
	// ComputeInstances are the compute instances' IDs with their compute profile.
	ComputeInstances []simMIGCompute `json:"computeInstances,omitempty"`
}

type simMIGCompute struct {
	ID        int `json:"id"`
	ProfileID int `json:"profileID"`
}

// installMIGMocks makes every visible GPU's MIG behave as described above.
func (s *Simulated) installMIGMocks() {
	s.mig = &simMIG{resetNeeded: map[*server.Device]bool{}, pending: map[*server.Device]int{}}
	for _, dev := range s.visible {
		s.installDeviceMIG(dev)
	}
}

func (s *Simulated) installDeviceMIG(dev *server.Device) {
	create := dev.CreateGpuInstanceWithPlacementFunc
	dev.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		dev.Lock()
		if len(dev.GpuInstances) > 0 && mode != dev.MigMode {
			dev.Unlock()
			return nvml.ERROR_IN_USE, nvml.ERROR_IN_USE
		}
		s.mig.mu.Lock()
		wait := s.mig.resetNeeded[dev] && mode != dev.MigMode
		if wait {
			s.mig.pending[dev] = mode
		}
		s.mig.mu.Unlock()
		if wait {
			dev.Unlock()
			return nvml.ERROR_RESET_REQUIRED, nvml.SUCCESS // asked for; takes effect at the next reset
		}
		dev.MigMode = mode
		dev.Unlock()
		return nvml.SUCCESS, s.saveMIG()
	}
	dev.GetMigModeFunc = func() (int, int, nvml.Return) {
		dev.RLock()
		defer dev.RUnlock()
		s.mig.mu.Lock()
		defer s.mig.mu.Unlock()
		if p, ok := s.mig.pending[dev]; ok {
			return dev.MigMode, p, nvml.SUCCESS
		}
		return dev.MigMode, dev.MigMode, nvml.SUCCESS
	}
	dev.CreateGpuInstanceFunc = func(*nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED // the plugin always names the placement
	}
	dev.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, at *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		if ret := simCheckPlacement(dev, info, at); ret != nvml.SUCCESS {
			return nil, ret
		}
		gi, ret := create(info, at)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		s.wrapGPUInstance(gi.(*server.GpuInstance))
		return gi, s.saveMIG()
	}
	dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	dev.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		migs := simMIGDevices(dev)
		if i < 0 || i >= len(migs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return migs[i], nvml.SUCCESS
	}
}

// SetMIGResetNeeded makes a MIG mode change of the GPU wait for a GPU reset, as on a GPU
// whose driver cannot change the mode with work on it: the change is pending, the mode as it
// was (tests and demonstrations).
func (s *Simulated) SetMIGResetNeeded(uuid string, needed bool) error {
	i := slices.IndexFunc(s.visible, func(d *server.Device) bool { return d.UUID == uuid })
	if i < 0 {
		return fmt.Errorf("simulated GPU %s: no such GPU in profile %s", uuid, s.profile)
	}
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	s.mig.resetNeeded[s.visible[i]] = needed
	if !needed {
		delete(s.mig.pending, s.visible[i])
	}
	return nil
}

// simCheckPlacement refuses what the hardware refuses.
func simCheckPlacement(dev *server.Device, info *nvml.GpuInstanceProfileInfo, at *nvml.GpuInstancePlacement) nvml.Return {
	dev.RLock()
	defer dev.RUnlock()
	if dev.MigMode != nvml.DEVICE_MIG_ENABLE {
		return nvml.ERROR_NOT_SUPPORTED
	}
	want := MIGPlacement{Start: int(at.Start), Size: int(at.Size)}
	possible := dev.Config.MIGProfiles.GpuInstancePlacements[int(info.Id)]
	if !slices.ContainsFunc(possible, func(p nvml.GpuInstancePlacement) bool { return p == *at }) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	sameProfile, memory := 0, info.MemorySizeMB
	for gi := range dev.GpuInstances {
		have := MIGPlacement{Start: int(gi.Info.Placement.Start), Size: int(gi.Info.Placement.Size)}
		if have.Overlaps(want) {
			return nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		if gi.Info.ProfileId == info.Id {
			sameProfile++
		}
		memory += dev.Config.MIGProfiles.GpuInstanceProfiles[int(gi.Info.ProfileId)].MemorySizeMB
	}
	if sameProfile >= int(info.InstanceCount) || memory > dev.Config.MemoryMB {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}

// wrapGPUInstance persists the instance's compute instances and refuses to destroy it under them.
func (s *Simulated) wrapGPUInstance(gi *server.GpuInstance) {
	destroy, createCI := gi.DestroyFunc, gi.CreateComputeInstanceFunc
	gi.DestroyFunc = func() nvml.Return {
		gi.RLock()
		busy := len(gi.ComputeInstances) > 0
		gi.RUnlock()
		if busy {
			return nvml.ERROR_IN_USE
		}
		if ret := destroy(); ret != nvml.SUCCESS {
			return ret
		}
		return s.saveMIG()
	}
	gi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		ci, ret := createCI(info)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		s.wrapComputeInstance(ci.(*server.ComputeInstance))
		return ci, s.saveMIG()
	}
}

func (s *Simulated) wrapComputeInstance(ci *server.ComputeInstance) {
	destroy := ci.DestroyFunc
	ci.DestroyFunc = func() nvml.Return {
		if ret := destroy(); ret != nvml.SUCCESS {
			return ret
		}
		return s.saveMIG()
	}
}

// simMIGDevices are the GPU's MIG devices, one per compute instance, ordered by GPU instance
// and compute instance ID, as NVML enumerates them.
func simMIGDevices(dev *server.Device) []nvml.Device {
	type ids struct{ gi, ci int }
	var all []ids
	dev.RLock()
	for gi := range dev.GpuInstances {
		gi.RLock()
		for ci := range gi.ComputeInstances {
			all = append(all, ids{int(gi.Info.Id), int(ci.Info.Id)})
		}
		gi.RUnlock()
	}
	dev.RUnlock()
	slices.SortFunc(all, func(a, b ids) int {
		if a.gi != b.gi {
			return a.gi - b.gi
		}
		return a.ci - b.ci
	})
	out := make([]nvml.Device, 0, len(all))
	for _, id := range all {
		uuid := simulatedMIGUUID(dev.UUID, id.gi, id.ci)
		out = append(out, &mock.Device{
			GetUUIDFunc:              func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return id.gi, nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return id.ci, nvml.SUCCESS },
			IsMigDeviceHandleFunc:    func() (bool, nvml.Return) { return true, nvml.SUCCESS },
		})
	}
	return out
}

// simulatedMIGUUID derives a MIG device UUID in NVML's format from its GPU and instance IDs.
func simulatedMIGUUID(gpuUUID string, gi, ci int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "vgpu-dra simulated MIG %s/%d/%d", gpuUUID, gi, ci))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("MIG-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}

// SetMIGStateFile keeps the simulated GPUs' MIG state in path: the GPUs take the state the file
// holds (their MIG mode and instances, as a previous process left them), every later change is
// written there, atomically, before NVML answers, and every MIG call reads it again first, so
// that two plugin processes (a handover) see one set of GPUs. A missing file is a GPU as it came.
func (s *Simulated) SetMIGStateFile(path string) error {
	s.mig.mu.Lock()
	s.mig.path = path
	s.mig.mu.Unlock()
	return s.syncMIG()
}

// syncMIG gives the GPUs the state of the state file, if there is one.
func (s *Simulated) syncMIG() error {
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	if s.mig.path == "" {
		return nil
	}
	data, err := os.ReadFile(s.mig.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("read simulated MIG state: %w", err)
	}
	var st simMIGState
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("read simulated MIG state %s: %w", s.mig.path, err)
	}
	for _, dev := range s.visible {
		s.restoreMIG(dev, st.GPUs[dev.UUID])
	}
	return nil
}

// restoreMIG gives dev the MIG mode and instances of g, with their IDs. Instance IDs go on from
// the highest ever given, as the driver's do.
func (s *Simulated) restoreMIG(dev *server.Device, g simMIGGPU) {
	dev.Lock()
	defer dev.Unlock()
	clear(dev.GpuInstances)
	dev.MigMode = nvml.DEVICE_MIG_DISABLE
	if g.MIGMode {
		dev.MigMode = nvml.DEVICE_MIG_ENABLE
	}
	for _, in := range g.Instances {
		gi := server.NewGpuInstanceFromInfo(nvml.GpuInstanceInfo{
			Device: dev, Id: uint32(in.GPUInstanceID), ProfileId: uint32(in.ProfileID),
			Placement: nvml.GpuInstancePlacement{Start: uint32(in.Placement.Start), Size: uint32(in.Placement.Size)},
		}, dev.Config.MIGProfiles)
		s.wrapGPUInstance(gi)
		for _, c := range in.ComputeInstances {
			ci := server.NewComputeInstanceFromInfo(nvml.ComputeInstanceInfo{
				Device: dev, GpuInstance: gi, Id: uint32(c.ID), ProfileId: uint32(c.ProfileID),
			})
			s.wrapComputeInstance(ci)
			gi.ComputeInstances[ci] = struct{}{}
			gi.ComputeInstanceCounter = max(gi.ComputeInstanceCounter, uint32(c.ID)+1)
		}
		dev.GpuInstances[gi] = struct{}{}
		dev.GpuInstanceCounter = max(dev.GpuInstanceCounter, uint32(in.GPUInstanceID)+1)
	}
}

// saveMIG writes every visible GPU's MIG state to the state file, if there is one. A failed
// write is NVML's ERROR_UNKNOWN: the change happened, but would not survive the process.
func (s *Simulated) saveMIG() nvml.Return {
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	if s.mig.path == "" {
		return nvml.SUCCESS
	}
	st := simMIGState{GPUs: map[string]simMIGGPU{}}
	for _, dev := range s.visible {
		st.GPUs[dev.UUID] = snapshotMIG(dev)
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return nvml.ERROR_UNKNOWN
	}
	if err := fsutil.WriteFileAtomic(s.mig.path, data, 0o600); err != nil {
		return nvml.ERROR_UNKNOWN
	}
	return nvml.SUCCESS
}

func snapshotMIG(dev *server.Device) simMIGGPU {
	dev.RLock()
	defer dev.RUnlock()
	g := simMIGGPU{MIGMode: dev.MigMode == nvml.DEVICE_MIG_ENABLE}
	for gi := range dev.GpuInstances {
		in := simMIGInstance{
			ProfileID: int(gi.Info.ProfileId), GPUInstanceID: int(gi.Info.Id),
			Placement: MIGPlacement{Start: int(gi.Info.Placement.Start), Size: int(gi.Info.Placement.Size)},
		}
		gi.RLock()
		for ci := range gi.ComputeInstances {
			in.ComputeInstances = append(in.ComputeInstances, simMIGCompute{ID: int(ci.Info.Id), ProfileID: int(ci.Info.ProfileId)})
		}
		gi.RUnlock()
		slices.SortFunc(in.ComputeInstances, func(a, b simMIGCompute) int { return a.ID - b.ID })
		g.Instances = append(g.Instances, in)
	}
	slices.SortFunc(g.Instances, func(a, b simMIGInstance) int { return a.GPUInstanceID - b.GPUInstanceID })
	return g
}

// MIGLayout implements MIG through the shared NVML reader.
func (s *Simulated) MIGLayout(uuid string) (MIGLayout, error) { return s.src.MIGLayout(uuid) }

// MIGMode implements MIG.
func (s *Simulated) MIGMode(uuid string) (bool, bool, error) {
	if err := s.syncMIG(); err != nil {
		return false, false, err
	}
	return s.src.MIGMode(uuid)
}

// SetMIGMode implements MIG.
func (s *Simulated) SetMIGMode(uuid string, enabled bool) error {
	if err := s.syncMIG(); err != nil {
		return err
	}
	return s.src.SetMIGMode(uuid, enabled)
}

// MIGInstances implements MIG.
func (s *Simulated) MIGInstances(uuid string) ([]MIGInstance, error) {
	if err := s.syncMIG(); err != nil {
		return nil, err
	}
	return s.src.MIGInstances(uuid)
}

// CreateMIGInstance implements MIG.
func (s *Simulated) CreateMIGInstance(uuid string, profileID int, at MIGPlacement) (MIGInstance, error) {
	if err := s.syncMIG(); err != nil {
		return MIGInstance{}, err
	}
	return s.src.CreateMIGInstance(uuid, profileID, at)
}

// DestroyMIGInstance implements MIG.
func (s *Simulated) DestroyMIGInstance(uuid string, gpuInstanceID int) error {
	if err := s.syncMIG(); err != nil {
		return err
	}
	return s.src.DestroyMIGInstance(uuid, gpuInstanceID)
}
