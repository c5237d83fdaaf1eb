package gpu

import (
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// SimulatedProcesses names the processes that run on a simulated GPU: the host PIDs on the GPU
// with this UUID. A simulated GPU has no processes of its own; the plugin tells it which
// containers' processes it holds (those whose vgpu.config lists the GPU), and NVML's
// per-process readers then report them as a real GPU reports the processes that use it.
type SimulatedProcesses func(uuid string) []int

// SimulatedSMUtil is the SM utilisation, in percent, that a simulated GPU reports for the
// process with this PID in every sample: deterministic, so that tests can assert the figures
// derived from it, and different between processes (5 to 95 in steps of 5).
func SimulatedSMUtil(pid int) uint32 {
	if pid < 0 {
		pid = -pid
	}
	return uint32(5 + (pid%19)*5)
}

// simUsage is the simulated GPUs' per-process state.
type simUsage struct {
	processes atomic.Pointer[SimulatedProcesses]
	// now is NVML's clock in microseconds; tests replace it.
	now func() uint64
}

func newSimUsage() *simUsage {
	return &simUsage{now: func() uint64 { return uint64(time.Now().UnixMicro()) }}
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

func (u *simUsage) pids(uuid string) []int {
	p := u.processes.Load()
	if p == nil {
		return nil
	}
	return (*p)(uuid)
}

// installUsageMocks answers NVML's per-process readers for one simulated GPU: a utilisation
// sample at every call for every process running on it (SimulatedSMUtil), and its processes
// with their memory "not available" — a simulated GPU holds no memory; what a container uses
// is what its ledger says.
func (u *simUsage) installUsageMocks(dev *server.Device) {
	dev.GetProcessUtilizationFunc = func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		now := u.now()
		pids := u.pids(dev.UUID)
		if now <= lastSeen || len(pids) == 0 {
			return nil, nvml.ERROR_NOT_FOUND
		}
		out := make([]nvml.ProcessUtilizationSample, 0, len(pids))
		for _, pid := range pids {
			out = append(out, nvml.ProcessUtilizationSample{Pid: uint32(pid), TimeStamp: now, SmUtil: SimulatedSMUtil(pid)})
		}
		return out, nvml.SUCCESS
	}
	dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		pids := u.pids(dev.UUID)
		out := make([]nvml.ProcessInfo, 0, len(pids))
		for _, pid := range pids {
			out = append(out, nvml.ProcessInfo{Pid: uint32(pid), UsedGpuMemory: notAvailable,
				GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF})
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
