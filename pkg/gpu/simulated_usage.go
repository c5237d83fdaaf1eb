package gpu

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// SimulatedProcesses names the processes that run on a simulated GPU with this UUID. A
// simulated GPU has no processes of its own; the plugin tells it which containers' processes it
// holds (those whose vgpu.config lists the GPU), and NVML's per-process readers then report them
// as a real GPU reports the processes that use it.
type SimulatedProcesses func(uuid string) []SimulatedProcess

// SimulatedProcess is one process on a simulated GPU.
type SimulatedProcess struct {
	PID int
	// CoreShare is the share of the GPU's SMs, in percent, the process may keep busy: its
	// container's core limit divided among the container's processes on the GPU, as libvgpu.so's
	// limiter holds them; 0 (or 100 and more): the whole GPU.
	CoreShare float64
}

// SimulatedSMUtil is the SM utilisation, in percent, that a simulated GPU reports for the
// process with this PID and core share (SimulatedProcess) in every sample, unless a test set
// one (SetProcessUsage): deterministic, so that tests can assert the figures derived from it,
// different between processes (5 to 95 % of its share in steps of 5), and within the share, so
// that a container that lets the library work never looks over its core limit.
func SimulatedSMUtil(pid int, share float64) uint32 {
	if pid < 0 {
		pid = -pid
	}
	u := uint32(5 + (pid%19)*5)
	if share <= 0 || share >= 100 {
		return u
	}
	return uint32(math.Floor(float64(u) * share / 100))
}

// simUsage is the simulated GPUs' per-process state.
type simUsage struct {
	processes atomic.Pointer[SimulatedProcesses]
	// now is NVML's clock in microseconds; tests replace it.
	now func() uint64
	// alive reports whether a process still runs; a test replaces it.
	alive func(pid int) bool

	mu sync.Mutex
	// held is what a test said a process holds on a GPU (SetProcessUsage): UUID → PID →.
	held map[string]map[int]heldUsage
}

// heldUsage is a process's use of a simulated GPU as a test set it.
type heldUsage struct {
	bytes  uint64
	smUtil uint32
	hasSM  bool
}

func newSimUsage() *simUsage {
	return &simUsage{now: func() uint64 { return uint64(time.Now().UnixMicro()) }, alive: processAlive,
		held: map[string]map[int]heldUsage{}}
}

// processAlive: kill(pid, 0) finds the process (EPERM: it exists, owned by another user).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// SetProcessUsage makes a simulated GPU report that the process holds bytes of its memory and,
// when smUtil is not nil, keeps that share of its SMs busy, as a real GPU reports a process that
// allocated and launched through any route (the library's or around it); with no smUtil, it
// keeps its container's share busy as any of its processes (SimulatedSMUtil), or none when no
// container lists it. It lasts while the
// process lives: like a real GPU, the simulated one frees a process's memory when it exits.
// bytes 0 with no smUtil forgets the process. Simulated mode only (the control socket,
// contract §11).
func (s *Simulated) SetProcessUsage(uuid string, pid int, bytes uint64, smUtil *uint32) error {
	if !slices.ContainsFunc(s.visible, func(d *server.Device) bool { return d.UUID == uuid }) {
		return fmt.Errorf("no simulated GPU %s", uuid)
	}
	if pid <= 0 || !s.usage.alive(pid) {
		return fmt.Errorf("no process %d", pid)
	}
	if smUtil != nil && *smUtil > 100 {
		return fmt.Errorf("SM utilisation %d%%: want 0-100", *smUtil)
	}
	u := s.usage
	u.mu.Lock()
	defer u.mu.Unlock()
	held := u.held[uuid]
	if held == nil {
		held = map[int]heldUsage{}
		u.held[uuid] = held
	}
	if bytes == 0 && smUtil == nil {
		delete(held, pid)
		return nil
	}
	h := heldUsage{bytes: bytes}
	if smUtil != nil {
		h.smUtil, h.hasSM = *smUtil, true
	}
	held[pid] = h
	return nil
}

// heldOn is the processes a test set on the GPU that still run; exited ones are forgotten.
func (u *simUsage) heldOn(uuid string) map[int]heldUsage {
	u.mu.Lock()
	defer u.mu.Unlock()
	held := u.held[uuid]
	maps.DeleteFunc(held, func(pid int, _ heldUsage) bool { return !u.alive(pid) })
	return maps.Clone(held)
}

// SetProcesses tells the simulated GPUs which processes run on them (nil: none). Safe to call
// at any time, also while the readers run.
func (s *Simulated) SetProcesses(procs SimulatedProcesses) {
	if procs == nil {
		s.usage.processes.Store(nil)
		return
	}
	s.usage.processes.Store(&procs)
}

func (u *simUsage) pids(uuid string) []SimulatedProcess {
	p := u.processes.Load()
	if p == nil {
		return nil
	}
	return (*p)(uuid)
}

// installUsageMocks answers NVML's per-process readers for one simulated GPU: a utilisation
// sample at every call for every process running on it (SimulatedSMUtil, or what
// SetProcessUsage said), and its processes with their memory: what SetProcessUsage said, else
// "not available" — a simulated GPU holds no memory of its own; what a container uses is what
// its ledger says.
func (u *simUsage) installUsageMocks(dev *server.Device) {
	dev.GetProcessUtilizationFunc = func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		now := u.now()
		pids, held := u.pids(dev.UUID), u.heldOn(dev.UUID)
		if now <= lastSeen || len(pids)+len(held) == 0 {
			return nil, nvml.ERROR_NOT_FOUND
		}
		out := make([]nvml.ProcessUtilizationSample, 0, len(pids)+len(held))
		share := make(map[int]float64, len(pids))
		for _, p := range pids {
			share[p.PID] = p.CoreShare
			if _, set := held[p.PID]; !set {
				out = append(out, nvml.ProcessUtilizationSample{Pid: uint32(p.PID), TimeStamp: now, SmUtil: SimulatedSMUtil(p.PID, p.CoreShare)})
			}
		}
		for _, pid := range slices.Sorted(maps.Keys(held)) {
			// A process a test gave memory but no SM figure keeps within its share like any
			// other of its container's (a well-behaved neighbour must not look over its cores);
			// one no container lists (yet: the lists are the usage sampler's, seconds old)
			// keeps no SM busy.
			sm := uint32(0)
			if s, listed := share[pid]; listed {
				sm = SimulatedSMUtil(pid, s)
			}
			if h := held[pid]; h.hasSM {
				sm = h.smUtil
			}
			out = append(out, nvml.ProcessUtilizationSample{Pid: uint32(pid), TimeStamp: now, SmUtil: sm})
		}
		return out, nvml.SUCCESS
	}
	dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		pids, held := u.pids(dev.UUID), u.heldOn(dev.UUID)
		out := make([]nvml.ProcessInfo, 0, len(pids)+len(held))
		info := func(pid int, bytes uint64) nvml.ProcessInfo {
			return nvml.ProcessInfo{Pid: uint32(pid), UsedGpuMemory: bytes, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
		}
		for _, p := range pids {
			if _, set := held[p.PID]; !set {
				out = append(out, info(p.PID, notAvailable))
			}
		}
		for _, pid := range slices.Sorted(maps.Keys(held)) {
			out = append(out, info(pid, held[pid].bytes))
		}
		return out, nvml.SUCCESS
	}
}

// ProcessUtilization reads NVML's per-process utilisation samples; see Source.
func (s *Simulated) ProcessUtilization(uuid string, since uint64) ([]ProcessSample, error) {
	return s.src.ProcessUtilization(uuid, since)
}

// ProcessMemory lists the GPU's compute processes; see Source.
func (s *Simulated) ProcessMemory(uuid string) ([]ProcessMemory, error) {
	return s.src.ProcessMemory(uuid)
}
