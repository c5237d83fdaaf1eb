package usage

import (
	"slices"
	"sync/atomic"

	"k8s.io/component-base/metrics"

	vgpumetrics "github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// Label names of the per-container and per-GPU series (contract §8).
var (
	containerLabels = []string{"namespace", "pod", "container", "claim", "gpu_uuid"}
	classLabels     = append(slices.Clip(containerLabels), "class")
	refusalLabels   = []string{"namespace", "pod", "container", "claim"}
	gpuLabels       = []string{"gpu_uuid", "device"}
)

func desc(name, help string, labels []string) *metrics.Desc {
	return metrics.NewDesc(vgpumetrics.Namespace+"_"+name, help, labels, nil, metrics.ALPHA, "")
}

// Collector serves the latest Snapshot as metrics: it only copies figures out, so a scrape
// costs no file read and no NVML call, and a series is gone as soon as a snapshot no longer
// has its container or GPU.
type Collector struct {
	metrics.BaseStableCollector
	snapshot func() *Snapshot
	// built holds the metrics of one snapshot, made by Prepare in the sampler's goroutine:
	// making a const metric (its sorted label pairs) is most of what a series costs, and a
	// snapshot does not change, so a scrape only writes them out.
	built atomic.Pointer[builtMetrics]

	memUsed, memLimit, memNVML, coresLimit, coresUsed *metrics.Desc
	coresCeiling, coresAllowance, coresClass          *metrics.Desc
	refusals                                          *metrics.Desc
	gpuMemPublished, gpuMemAllocated                  *metrics.Desc
	gpuCoresPublished, gpuCoresAllocated              *metrics.Desc
	gpuShares, gpuContainers, gpuHealthy              *metrics.Desc
	omitted                                           *metrics.Desc
}

var _ metrics.StableCollector = (*Collector)(nil)

// NewCollector serves snapshot's snapshots (Sampler.Snapshot); register it with
// KubeRegistry.CustomMustRegister.
func NewCollector(snapshot func() *Snapshot) *Collector {
	return &Collector{
		snapshot: snapshot,
		memUsed: desc("container_memory_used_bytes",
			"GPU memory the container uses on the GPU, from its libvgpu.so ledger: its live processes' allocations plus the driver memory NVML sees and the hooks do not.", containerLabels),
		memLimit: desc("container_memory_limit_bytes",
			"GPU memory limit libvgpu.so enforces for the container on the GPU (the GPU's published memory for a whole-GPU claim).", containerLabels),
		memNVML: desc("container_memory_nvml_bytes",
			"GPU memory NVML reports for the container's registered processes on the GPU: the cross-check of container_memory_used_bytes (absent where NVML cannot tell).", containerLabels),
		coresLimit: desc("container_cores_limit_percent",
			"Share of the GPU's SMs the container may use, in percent (100 without a limit).", containerLabels),
		coresCeiling: desc("container_cores_ceiling_percent",
			"Share of the GPU's SMs the container may burst to when the GPU has idle time, in percent: its class's and claim configuration's ceiling (container_cores_limit_percent without a burst).", containerLabels),
		coresAllowance: desc("container_cores_allowance_percent",
			"Share of the GPU's SMs the compute arbiter allows the container now, in percent, between its limit and its ceiling (absent where the arbiter does not divide the GPU).", containerLabels),
		coresClass: desc("container_cores_class_info",
			"The container's compute class on the GPU (Guaranteed or BestEffort), always 1; absent without a core limit.", classLabels),
		coresUsed: desc("container_cores_used_percent",
			"SM utilisation of the container's registered processes on the GPU, in percent: the sum of NVML's newest per-process samples since the previous sample.", containerLabels),
		refusals: desc("container_memory_refusals_total",
			"Allocations libvgpu.so refused the container because they would pass its memory limit (CUDA_ERROR_OUT_OF_MEMORY), on any GPU.", refusalLabels),
		gpuMemPublished: desc("gpu_memory_published_bytes", "Memory capacity the GPU is published with (total minus --memory-reserve).", gpuLabels),
		gpuMemAllocated: desc("gpu_memory_allocated_bytes", "Memory of the GPU taken by prepared claims.", gpuLabels),
		gpuCoresPublished: desc("gpu_cores_published_percent",
			"Cores capacity the GPU is published with, in percent of its SMs (always 100).", gpuLabels),
		gpuCoresAllocated: desc("gpu_cores_allocated_percent", "Cores of the GPU taken by prepared claims, in percent of its SMs.", gpuLabels),
		gpuShares:         desc("gpu_shares", "Prepared allocation results on the GPU.", gpuLabels),
		gpuContainers: desc("gpu_containers",
			"vGPU containers using the GPU (a per-claim-path claim counts once for all its containers).", gpuLabels),
		gpuHealthy: desc("gpu_healthy", "1 while the GPU is healthy, 0 after a health event made it unhealthy.", gpuLabels),
		omitted: desc("usage_series_omitted",
			"(container, GPU) pairs left out of the per-container series by the series bound.", nil),
	}
}

// DescribeWithStability implements metrics.StableCollector.
func (c *Collector) DescribeWithStability(ch chan<- *metrics.Desc) {
	for _, d := range []*metrics.Desc{c.memUsed, c.memLimit, c.memNVML, c.coresLimit, c.coresUsed,
		c.coresCeiling, c.coresAllowance, c.coresClass, c.refusals,
		c.gpuMemPublished, c.gpuMemAllocated, c.gpuCoresPublished, c.gpuCoresAllocated, c.gpuShares,
		c.gpuContainers, c.gpuHealthy, c.omitted} {
		ch <- d
	}
}

type builtMetrics struct {
	snap    *Snapshot
	metrics []metrics.Metric
}

// CollectWithStability implements metrics.StableCollector: it sends the metrics Prepare made
// of the current snapshot, and makes them itself when Prepare has not (yet) seen it.
func (c *Collector) CollectWithStability(ch chan<- metrics.Metric) {
	snap := c.snapshot()
	b := c.built.Load()
	if b == nil || b.snap != snap {
		b = c.build(snap)
		c.built.Store(b)
	}
	for _, m := range b.metrics {
		ch <- m
	}
}

// Prepare makes the metrics of snap ahead of the scrapes (Deps.Published). Before the
// collector is registered its descriptors cannot make metrics yet: nothing is prepared then.
func (c *Collector) Prepare(snap *Snapshot) {
	if c.memUsed.IsCreated() {
		c.built.Store(c.build(snap))
	}
}

func (c *Collector) build(snap *Snapshot) *builtMetrics {
	out := make([]metrics.Metric, 0, 8*len(snap.Containers)+len(snap.Refusals)+7*len(snap.GPUs)+1)
	gauge := func(d *metrics.Desc, v float64, labels ...string) {
		out = append(out, metrics.NewLazyConstMetric(d, metrics.GaugeValue, v, labels...))
	}
	for _, r := range snap.Containers {
		l := []string{r.Namespace, r.Pod, r.Container, r.Claim, r.GPU}
		gauge(c.memLimit, r.MemoryLimit, l...)
		gauge(c.coresLimit, r.CoresLimit, l...)
		gauge(c.coresCeiling, r.CoresCeiling, l...)
		if r.HasCoresAllowance {
			gauge(c.coresAllowance, r.CoresAllowance, l...)
		}
		if r.Class != "" {
			gauge(c.coresClass, 1, append(l, r.Class)...)
		}
		if r.HasMemoryUsed {
			gauge(c.memUsed, r.MemoryUsed, l...)
		}
		if r.HasMemoryNVML {
			gauge(c.memNVML, r.MemoryNVML, l...)
		}
		if r.HasCoresUsed {
			gauge(c.coresUsed, r.CoresUsed, l...)
		}
	}
	for _, r := range snap.Refusals {
		out = append(out, metrics.NewLazyConstMetric(c.refusals, metrics.CounterValue, r.Count, r.Namespace, r.Pod, r.Container, r.Claim))
	}
	for _, g := range snap.GPUs {
		l := []string{g.UUID, g.Device}
		gauge(c.gpuMemPublished, float64(g.PublishedMemory), l...)
		gauge(c.gpuMemAllocated, float64(g.AllocatedMemory), l...)
		gauge(c.gpuCoresPublished, 100, l...)
		gauge(c.gpuCoresAllocated, float64(g.AllocatedCores), l...)
		gauge(c.gpuShares, float64(g.Shares), l...)
		gauge(c.gpuContainers, float64(g.Containers), l...)
		healthy := 0.0
		if g.Healthy {
			healthy = 1
		}
		gauge(c.gpuHealthy, healthy, l...)
	}
	gauge(c.omitted, float64(snap.Omitted))
	return &builtMetrics{snap: snap, metrics: out}
}
