package gpu

import (
	"errors"
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ProcessSample is NVML's latest utilisation sample of one process on one GPU.
type ProcessSample struct {
	// PID is the process's PID as NVML reports it: in the host's PID namespace (the plugin runs
	// with hostPID, as pids.config's PIDs are).
	PID int
	// SMUtil is the percentage of the GPU's streaming multiprocessors the process kept busy
	// during the sample's period (0-100).
	SMUtil uint32
	// TimeStamp is when NVML took the sample, in microseconds of NVML's clock. Pass the largest
	// one seen back to ProcessUtilization to get only newer samples.
	TimeStamp uint64
}

// ProcessMemory is the device memory one compute process holds on one GPU, as NVML reports it.
type ProcessMemory struct {
	PID int
	// UsedBytes is what the process holds; meaningful only when Known.
	UsedBytes uint64
	// Known is false where NVML cannot tell (NVML_VALUE_NOT_AVAILABLE): a process NVML does
	// not let this caller see into, a simulated GPU.
	Known bool
}

// ErrUnknownGPU is wrapped by the usage readers' errors for a UUID this source does not have.
var ErrUnknownGPU = errors.New("no such GPU")

// ProcessUtilization returns, per process, the newest of NVML's utilisation samples of the GPU
// taken after since (microseconds; 0 for every sample NVML still keeps). A GPU with no sample
// after since returns none and no error.
func (s *nvmlSource) ProcessUtilization(uuid string, since uint64) ([]ProcessSample, error) {
	dev, err := s.deviceByUUID(uuid)
	if err != nil {
		return nil, err
	}
	raw, ret := dev.GetProcessUtilization(since)
	switch ret {
	case nvml.SUCCESS, nvml.ERROR_NOT_FOUND: // NOT_FOUND: no sample after since
	default:
		return nil, fmt.Errorf("read process utilisation of GPU %s: %w", uuid, ret)
	}
	newest := make(map[uint32]int, len(raw))
	out := make([]ProcessSample, 0, len(raw))
	for _, r := range raw {
		if r.TimeStamp <= since {
			continue
		}
		i, seen := newest[r.Pid]
		if !seen {
			newest[r.Pid] = len(out)
			out = append(out, ProcessSample{PID: int(r.Pid), SMUtil: min(r.SmUtil, 100), TimeStamp: r.TimeStamp})
			continue
		}
		if r.TimeStamp > out[i].TimeStamp {
			out[i] = ProcessSample{PID: int(r.Pid), SMUtil: min(r.SmUtil, 100), TimeStamp: r.TimeStamp}
		}
	}
	return out, nil
}

// notAvailable is NVML_VALUE_NOT_AVAILABLE in an unsigned field: NVML cannot tell (a process
// of another container without the privilege to see it, or a GPU in some virtualised modes).
const notAvailable = math.MaxUint64

// ProcessMemory lists the compute processes on the GPU with the device memory each holds.
func (s *nvmlSource) ProcessMemory(uuid string) ([]ProcessMemory, error) {
	dev, err := s.deviceByUUID(uuid)
	if err != nil {
		return nil, err
	}
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("list compute processes of GPU %s: %w", uuid, ret)
	}
	out := make([]ProcessMemory, 0, len(procs))
	for _, p := range procs {
		if p.UsedGpuMemory == notAvailable {
			out = append(out, ProcessMemory{PID: int(p.Pid)})
			continue
		}
		out = append(out, ProcessMemory{PID: int(p.Pid), UsedBytes: p.UsedGpuMemory, Known: true})
	}
	return out, nil
}

func (s *nvmlSource) deviceByUUID(uuid string) (nvml.Device, error) {
	dev, ret := s.lib.DeviceGetHandleByUUID(uuid)
	switch ret {
	case nvml.SUCCESS:
		return dev, nil
	case nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_NOT_FOUND:
		return nil, fmt.Errorf("open GPU %s: %w: %w", uuid, ErrUnknownGPU, ret)
	default:
		return nil, fmt.Errorf("open GPU %s: %w", uuid, ret)
	}
}
