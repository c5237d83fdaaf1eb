package usage

import (
	"cmp"
	"time"
)

// Target is one set of library files the sampler reads: a container's on the NRI path, or a
// claim's on the per-claim path, where all the claim's containers share one set.
type Target struct {
	Namespace string
	// Pod and Container are empty on the per-claim path: the plugin does not know the claim's
	// containers there (no NRI), only the claim.
	Pod       string
	Container string
	// Claim is the ResourceClaim's name.
	Claim string
	// ConfigDir holds vgpu.config and pids.config; VMemNodeDir the ledger (host paths).
	ConfigDir   string
	VMemNodeDir string
	// Key is the enforcer's name of the target (enforce.Target.Key): the container ID on the
	// NRI path, "claim/<UID>" on the per-claim path. Deps.Allowance is asked with it; empty:
	// never asked.
	Key string
	// Compute are the target's compute terms by GPU UUID, from the checkpoint (contract §16):
	// only a GPU where it has a core limit has them.
	Compute map[string]ComputeTerms
}

// ComputeTerms are a target's class and burst ceiling on one GPU (contract §16).
type ComputeTerms struct {
	// Class is "Guaranteed" or "BestEffort".
	Class string
	// Ceiling is the percent of SMs it may use when the GPU has idle time (at least its limit).
	Ceiling float64
}

// GPU is one GPU of the node, with what is published and allocated of it (the driver's
// GPUStates).
type GPU struct {
	UUID string
	// Device is the published device name, gpu-<index>.
	Device string
	// PublishedMemory is the memory capacity in the ResourceSlice (total minus the reserve).
	PublishedMemory int64
	// AllocatedMemory and AllocatedCores are the sums over the prepared claims' results on
	// this GPU; a result that takes the whole GPU counts as all of it.
	AllocatedMemory int64
	AllocatedCores  int64
	// Shares is the number of prepared allocation results on the GPU (admin access not
	// counted).
	Shares int
	// Healthy is false from a health event until the GPU is marked healthy again.
	Healthy bool
}

// ContainerGPU is one container's (or per-claim claim's) use of one GPU.
type ContainerGPU struct {
	Namespace, Pod, Container, Claim, GPU string
	// MemoryLimit is the limit libvgpu.so enforces, in bytes; a container without one (a
	// whole-GPU claim) gets the GPU's published memory, the most it can use.
	MemoryLimit float64
	// CoresLimit is the percentage of SMs; 100 without a limit.
	CoresLimit float64
	// CoresCeiling is what the container may burst to, percent: CoresLimit without a burst.
	CoresCeiling float64
	// Class is the compute class on the GPU; empty where nothing divides it (no core limit).
	Class string
	// CoresAllowance is the arbiter's current allowance, percent; valid when HasCoresAllowance
	// (the arbiter has divided the GPU for the container).
	CoresAllowance    float64
	HasCoresAllowance bool
	// MemoryUsed is the ledger's figure (bytes); valid when HasMemoryUsed. A container with a
	// limit and no ledger yet has used nothing; one without any limit has no ledger at all
	// (the library passes through), so nothing is known.
	MemoryUsed    float64
	HasMemoryUsed bool
	// MemoryNVML is what NVML says the container's processes hold on the GPU; valid when
	// HasMemoryNVML (NVML could tell for every one of them).
	MemoryNVML    float64
	HasMemoryNVML bool
	// CoresUsed is the sum of the newest SM utilisation samples of the container's processes
	// since the previous sample, capped at 100; valid when HasCoresUsed.
	CoresUsed    float64
	HasCoresUsed bool
}

// Refusals is the count of allocations libvgpu.so refused a container for its memory limit: 0
// for a container without a ledger yet; absent while its ledger cannot be read.
type Refusals struct {
	Namespace, Pod, Container, Claim string
	Count                            float64
}

func (r Refusals) identity() Refusals { r.Count = 0; return r }

// GPUUsage is one GPU in a snapshot: its state, and how many targets use it.
type GPUUsage struct {
	GPU
	Containers int
}

// Snapshot is one sample of the node. It is never changed once published: /metrics reads it
// without a lock.
type Snapshot struct {
	Taken time.Time
	// Containers are sorted by namespace, pod, container, claim and GPU, and bounded by
	// Config.MaxSeries; Omitted counts what the bound left out.
	Containers []ContainerGPU
	Refusals   []Refusals
	GPUs       []GPUUsage
	Omitted    int
}

func compareRows(a, b ContainerGPU) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.Container, b.Container),
		cmp.Compare(a.Claim, b.Claim), cmp.Compare(a.GPU, b.GPU))
}
