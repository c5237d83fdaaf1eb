package plugin

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/arbiter"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce/podevents"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// startEnforcer runs the node-side enforcer (pkg/enforce, contract §15) for the ownership
// term: only the owner acts, and the term's end stops it. Its view is the NRI cache (each
// container's cgroup, recorded at StartContainer from its init process), the checkpoint (each
// claim's limits) and the registry's record of who registered; none of it is a file a
// container can write.
func (p *Plugin) startEnforcer(ctx context.Context, t *ownerTerm, em *metrics.EnforcementMetrics) {
	cfg := p.cfg
	if !cfg.Enforce || !cfg.VGPU {
		return
	}
	if t.cgroups == nil {
		return // logged when the term began
	}
	cgroups := *t.cgroups
	events := podevents.New(p.deps.KubeClient, cfg.NodeName)
	context.AfterFunc(ctx, events.Shutdown)
	var cache *nri.Cache
	if p.nri != nil {
		cache = p.nri.plugin.Cache()
	}
	layout := cfg.Layout()
	// Claims carry classes and ceilings (contract §16); the device plugin's shares do not,
	// so only this plugin divides GPUs.
	arb := arbiter.New(func(target, path string, err error) {
		p.logger.Error(err, "Cannot publish a container's core allowance; it keeps the one it has", "target", target, "path", path)
	})
	freeze, registered := enforce.NodeHooks(p.logger, cfg.Enforcement, cgroups, layout.LibraryInstalled(), t.registry.Registered)
	e := enforce.New(cfg.Enforcement.Config(), enforce.Deps{
		Ready: func() bool {
			return p.term.Load() == t && (cache == nil || cache.Synced())
		},
		GPUs:        func() []string { return servedGPUs(p.devices) },
		Targets:     func() []enforce.Target { return enforceTargets(cache, t.store, layout, cgroups.V1Pids) },
		Processes:   p.gpus.ProcessMemory,
		Utilization: p.gpus.ProcessUtilization,
		Freeze:      freeze,
		CgroupOf:    cgroups.OfPID,
		Registered:  registered,
		PodOf: func(cg string) (string, bool) {
			pod, _, ok := registry.PodOfCgroup(cg)
			return pod, ok
		},
		Kill:    enforce.Killer{Cgroups: cgroups}.Kill,
		Event:   events.Warn,
		Arbiter: arb,
		Metrics: em,
	})
	t.arbiter.Store(arb) // the usage metrics show its allowances
	c := e.Config()
	// A wake counts for one compute pass (contract §16, "Waking").
	arb.SetWakeHold(c.CorePeriod, em.Wake)
	if err := arb.StartWaking(ctx); err != nil {
		p.logger.Error(err, "Cannot watch the containers' wakes (inotify); guaranteed shares get their request back at the next compute pass instead")
	}
	p.logger.Info("Node-side enforcement of memory and core limits", "period", c.Period, "grace", c.Grace, "slackPerProcess", c.SlackPerProcess, "foreignGPUProcess", c.Foreign,
		"coreEnforcement", c.Cores, "coreMargin", c.CoreMargin, "coreWindow", c.CoreWindow, "corePeriod", c.CorePeriod, "throttle", freeze != nil, "cgroups", cgroups.String())
	go e.Run(klog.NewContext(ctx, p.logger.WithName("enforce")))
}

// enforceTargets lists what the enforcer holds to limits: every vGPU container on the NRI path
// that runs (its newest instance, with the cgroup the NRI plugin recorded), and every claim
// prepared on the per-claim path (its pods' containers share its limits).
func enforceTargets(cache *nri.Cache, store *checkpoint.Store, layout claimdir.Layout, v1Pids bool) []enforce.Target {
	var out []enforce.Target
	if cache != nil {
		for _, in := range liveInstances(cache) {
			cg := in.Cgroup.Unified
			if v1Pids {
				cg = in.Cgroup.PIDsV1
			}
			if cg == "" {
				continue // created, not started: no process yet
			}
			c, ok := store.Get(in.ClaimUID)
			if !ok {
				continue
			}
			t := enforce.Target{Key: in.ContainerID, Namespace: in.PodNamespace, Pod: in.PodName, PodUID: in.PodUID,
				Container: in.ContainerName, Claim: c.Name, Cgroups: []string{cg}, ConfigDir: in.ConfigDir}
			if dirs, err := layout.ContainerDirs(in.ClaimUID, in.PodUID, in.ContainerName); err == nil {
				t.WakeDir = dirs.VGPULock
			}
			addLimits(&t, c.Devices, in.Results, in.AdminResults)
			out = append(out, t)
		}
	}
	store.Range(func(uid string, c *checkpoint.Claim) {
		if c.Path != contract.PathPerClaim || c.State != checkpoint.PrepareCompleted {
			return
		}
		dirs, err := layout.PerClaimDirs(uid)
		if err != nil {
			return
		}
		t := enforce.Target{Key: perClaimKey(uid), Namespace: c.Namespace, Claim: c.Name, Pods: append([]string(nil), c.ReservedFor...),
			ConfigDir: dirs.Config, WakeDir: dirs.VGPULock}
		addLimits(&t, c.Devices, allResults(c.Devices), nil)
		out = append(out, t)
	})
	return out
}

// perClaimKey is the enforcer's (and the arbiter's) name of a per-claim-path claim; a container
// on the NRI path goes by its container ID.
func perClaimKey(uid string) string { return "claim/" + uid }

// allResults are the indexes of every result of a claim: a per-claim claim's containers use them
// all.
func allResults(devs []checkpoint.Device) []int {
	all := make([]int, len(devs))
	for i := range all {
		all[i] = i
	}
	return all
}

// addLimits sets the target's limit on each GPU from the claim's results it uses: their
// memory adds up per GPU; a result without a memory figure (the whole GPU) or with admin
// access leaves that GPU unlimited. Cores add up the same way, below 100; a result without a
// core figure, or with admin access, leaves the GPU without a core limit.
func addLimits(t *enforce.Target, devs []checkpoint.Device, results, admin []int) {
	t.Limits, t.Unlimited, t.CoreLimits = map[string]uint64{}, map[string]bool{}, map[string]uint32{}
	t.CoreCeilings, t.BestEffort = map[string]uint32{}, map[string]bool{}
	noCores := map[string]bool{}
	guaranteed := map[string]bool{}
	defer func() {
		for uuid, c := range t.CoreLimits {
			if noCores[uuid] || c >= 100 {
				delete(t.CoreLimits, uuid)
				delete(t.CoreCeilings, uuid)
				delete(t.BestEffort, uuid)
				continue
			}
			t.CoreCeilings[uuid] = min(t.CoreCeilings[uuid], 100)
			if guaranteed[uuid] {
				delete(t.BestEffort, uuid) // best-effort only when every share there is
			}
		}
	}()
	for _, i := range admin {
		if i >= 0 && i < len(devs) {
			noCores[devs[i].GPUUUID] = true
		}
	}
	for _, i := range results {
		if i < 0 || i >= len(devs) {
			continue
		}
		switch d := devs[i]; {
		case d.AdminAccess || d.Cores <= 0:
			noCores[d.GPUUUID] = true
		default:
			t.CoreLimits[d.GPUUUID] += uint32(min(d.Cores, 100))
			t.CoreCeilings[d.GPUUUID] += uint32(min(d.Ceiling(), 100))
			if d.BestEffort() {
				t.BestEffort[d.GPUUUID] = true
			} else {
				guaranteed[d.GPUUUID] = true
			}
		}
	}
	for _, i := range admin {
		if i >= 0 && i < len(devs) {
			t.Unlimited[devs[i].GPUUUID] = true
		}
	}
	for _, i := range results {
		if i < 0 || i >= len(devs) {
			continue
		}
		d := devs[i]
		switch {
		case d.AdminAccess:
			t.Unlimited[d.GPUUUID] = true
		case d.MemoryBytes <= 0:
			t.Unlimited[d.GPUUUID] = true
			t.MustRegister = true
		default:
			t.Limits[d.GPUUUID] += uint64(d.MemoryBytes)
			t.MustRegister = true
		}
	}
}

// servedGPUs are the UUIDs of the node's GPUs.
func servedGPUs(devs []gpu.Device) []string {
	out := make([]string, len(devs))
	for i, d := range devs {
		out[i] = d.UUID
	}
	return out
}
