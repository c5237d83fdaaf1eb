package plugin

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/arbiter"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
)

// startUsage starts the background sampler of per-container usage and registers its metrics
// (contract §8). It reads files and NVML on its own goroutine, every interval, and /metrics
// serves its latest snapshot: a scrape never reads a ledger, and a ledger read never waits
// for or holds anything a registration or an NRI hook needs (targets are copies of the cache
// and the checkpoint). On simulated GPUs the containers' registered processes are what the
// GPUs run, so their per-process samples exist.
func (p *Plugin) startUsage(ctx context.Context, layout claimdir.Layout) *usage.Sampler {
	um := metrics.NewUsageMetrics(p.metrics.Registry)
	var collector *usage.Collector
	sampler := usage.NewSampler(usage.Config{Interval: p.cfg.UsageInterval, MaxSeries: p.cfg.UsageMaxSeries}, usage.Deps{
		Targets:   p.ownerUsageTargets(layout),
		GPUs:      p.ownerUsageGPUs(),
		NVML:      p.gpus,
		Allowance: p.ownerAllowance,
		ReadError: um.ReadError,
		Observe:   um.Observe,
		Published: func(s *usage.Snapshot) { collector.Prepare(s) },
	})
	collector = usage.NewCollector(sampler.Snapshot)
	p.metrics.Registry.CustomMustRegister(collector)
	if sim, ok := p.gpus.(*gpu.Simulated); ok {
		sim.SetProcesses(sampler.SimulatedProcessesOn)
	}
	go sampler.Run(klog.NewContext(ctx, klog.FromContext(ctx).WithName("usage")))
	return sampler
}

// ownerUsageTargets are usageTargets of the node while this instance owns it, and none while it
// observes (contract §14): during a handover both pods' /metrics would otherwise show the
// node's containers.
func (p *Plugin) ownerUsageTargets(layout claimdir.Layout) func() []usage.Target {
	return func() []usage.Target {
		t := p.term.Load()
		if t == nil {
			return nil
		}
		return usageTargets(p.NRICache(), t.store, layout)()
	}
}

// ownerAllowance is the owner's compute arbiter's current allowance of a target on a GPU
// (contract §16); none while this instance observes, or before its enforcer runs.
func (p *Plugin) ownerAllowance(key, gpu string) (float64, bool) {
	t := p.term.Load()
	if t == nil {
		return 0, false
	}
	a := t.arbiter.Load()
	if a == nil {
		return 0, false
	}
	return a.Allowance(key, gpu)
}

// ownerUsageGPUs is usageGPUs of the owner's driver; none while this instance observes.
func (p *Plugin) ownerUsageGPUs() func() []usage.GPU {
	return func() []usage.GPU {
		t := p.term.Load()
		if t == nil {
			return nil
		}
		return usageGPUs(t.driver)()
	}
}

// usageTargets lists what the sampler reads: every vGPU container on the NRI path that has not
// stopped (its newest instance: the directory belongs to the pod and name), and every claim
// prepared on the per-claim path, whose containers share one directory set.
func usageTargets(cache *nri.Cache, store *checkpoint.Store, layout claimdir.Layout) func() []usage.Target {
	return func() []usage.Target {
		claims := store.Snapshot().Claims
		var out []usage.Target
		if cache != nil {
			for _, in := range liveInstances(cache) {
				c, ok := claims[in.ClaimUID]
				if !ok {
					continue
				}
				dirs, err := layout.ContainerDirs(in.ClaimUID, in.PodUID, in.ContainerName)
				if err != nil {
					continue // names the cache validated at creation; cannot happen
				}
				out = append(out, usage.Target{Namespace: in.PodNamespace, Pod: in.PodName, Container: in.ContainerName,
					Claim: c.Name, ConfigDir: dirs.Config, VMemNodeDir: dirs.VMemNode,
					Key: in.ContainerID, Compute: computeTerms(c.Devices, in.Results, in.AdminResults)})
			}
		}
		for uid, c := range claims {
			if c.Path != contract.PathPerClaim || c.State != checkpoint.PrepareCompleted {
				continue
			}
			dirs, err := layout.PerClaimDirs(uid)
			if err != nil {
				continue
			}
			out = append(out, usage.Target{Namespace: c.Namespace, Claim: c.Name, ConfigDir: dirs.Config, VMemNodeDir: dirs.VMemNode,
				Key: perClaimKey(uid), Compute: computeTerms(c.Devices, allResults(c.Devices), nil)})
		}
		return out
	}
}

// computeTerms are a target's class and ceiling on each GPU where it has a core limit, as the
// enforcer gives them to the arbiter (addLimits), so the metrics show the terms it divides by.
func computeTerms(devs []checkpoint.Device, results, admin []int) map[string]usage.ComputeTerms {
	var t enforce.Target
	addLimits(&t, devs, results, admin)
	if len(t.CoreLimits) == 0 {
		return nil
	}
	out := make(map[string]usage.ComputeTerms, len(t.CoreLimits))
	for uuid, limit := range t.CoreLimits {
		class := arbiter.Guaranteed
		if t.BestEffort[uuid] {
			class = arbiter.BestEffort
		}
		out[uuid] = usage.ComputeTerms{Class: string(class), Ceiling: float64(max(t.CoreCeilings[uuid], limit))}
	}
	return out
}

// liveInstances are the newest instance of every (pod, container name) of the NRI cache that has
// not stopped: the container whose directory, limits and processes the name stands for now.
func liveInstances(cache *nri.Cache) []nri.Instance {
	newest := map[[2]string]nri.Instance{}
	for _, in := range cache.List() { // ordered by pod, name and creation: the last wins
		newest[[2]string{in.PodUID, in.ContainerName}] = in
	}
	out := make([]nri.Instance, 0, len(newest))
	for _, in := range newest {
		if in.State != nri.StateStopped {
			out = append(out, in)
		}
	}
	return out
}

// usageGPUs is the driver's view of the GPUs, already in the sampler's terms.
func usageGPUs(d *driver.Driver) func() []usage.GPU { return d.GPUStates }
