package gpu

import "context"

// Device is one physical GPU as the plugin publishes it (contract §2).
type Device struct {
	// Index is the NVML index; the published device name is gpu-<Index>.
	Index int
	// UUID is NVML's GPU UUID, e.g. "GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7".
	UUID string
	// MemoryBytes is the total device memory, as NVML reports it.
	MemoryBytes uint64
	// ProductName is NVML's device name, e.g. "NVIDIA H200 141GB HBM3e".
	ProductName string
	// Brand is NVML's brand in words, e.g. "Nvidia", "Tesla", "GeForce"; "Unknown" when NVML
	// cannot tell. See brandName.
	Brand string
	// Architecture is NVML's architecture in words, e.g. "Hopper", "Ampere"; "Unknown" when
	// NVML cannot tell. See architectureName.
	Architecture string
	// CUDAComputeCapability is the raw "major.minor", e.g. "9.0" (not yet semver-normalised).
	CUDAComputeCapability string
	// DriverVersion is the raw driver version, e.g. "550.54.15" (not yet semver-normalised).
	DriverVersion string
	// CUDADriverVersion is NVML's raw CUDA driver version, e.g. 12040 for CUDA 12.4.
	CUDADriverVersion int
	// PCIBusID is domain:bus:device.function in lower case, the domain with at least 4 digits,
	// as sysfs names the device: "0000:0f:00.0".
	PCIBusID string
	// NUMANode is the GPU's NUMA node, nil when unknown.
	NUMANode *int
}

// HealthEvent is a change of one GPU's health.
type HealthEvent struct {
	// UUID names the GPU.
	UUID string
	// Healthy is false from the first fault until the GPU is marked healthy again.
	Healthy bool
	// Fatal is set on an unhealthy GPU whose fault needs a GPU reset or more: running work on it
	// is lost (taint effect NoExecute rather than NoSchedule).
	Fatal bool
	// Reason says what happened in words, e.g. "XID 79 (GPU has fallen off the bus)".
	Reason string
}

// Source is where the plugin's GPUs come from.
type Source interface {
	// Devices returns every GPU, sorted by index. Deterministic.
	Devices(ctx context.Context) ([]Device, error)
	// WatchHealth sends health changes until ctx ends; returns nil on ctx end. NVML errors are
	// logged and retried, never returned. Only transitions are sent: a GPU that is already
	// unhealthy gets another event only when its fault becomes fatal.
	WatchHealth(ctx context.Context, events chan<- HealthEvent) error
	// ProcessUtilization returns, per process, the newest utilisation sample of the GPU with
	// this UUID taken after since (NVML microseconds; 0 for all). See ProcessSample.
	ProcessUtilization(uuid string, since uint64) ([]ProcessSample, error)
	// ProcessMemory lists the GPU's compute processes with the memory each holds, where NVML
	// can tell.
	ProcessMemory(uuid string) ([]ProcessMemory, error)
	// Close releases NVML. Call it after every WatchHealth has returned.
	Close() error
}
