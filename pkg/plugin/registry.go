package plugin

import (
	"context"
	"fmt"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// startRegistry serves the registry socket: NRI-path registrations resolve through the NRI
// cache (nil when NRI is off: such requests are NOT_FOUND), per-claim registrations through
// the checkpoint. Its socket answering is part of liveness.
func (p *Plugin) startRegistry(ctx context.Context, store *checkpoint.Store) error {
	layout := claimdir.Layout{StateDir: p.cfg.StateDir}
	cgroups, err := registry.DetectCgroupHierarchy("/proc")
	if err != nil {
		return fmt.Errorf("find the cgroup hierarchy for registry peer checks: %w", err)
	}
	var containers registry.ContainerResolver
	if p.nriCache != nil {
		containers = nriTargets{cache: p.nriCache, v1Pids: cgroups.V1Pids}
	}
	p.registry, err = registry.Start(ctx, registry.Config{Socket: layout.RegistrySocket()}, registry.Deps{
		Containers: containers,
		Claims:     registry.CheckpointClaims{Store: store, Layout: layout},
		Cgroups:    &cgroups,
		Metrics:    metrics.NewRegistryMetrics(p.metrics.Registry),
	})
	if err != nil {
		return err
	}
	p.health.Add("registry-socket", p.registry.Check)
	return nil
}

// nriTargets adapts the NRI cache to the registry's ContainerResolver. The cgroup handed over is
// the one the NRI plugin read from /proc/<init pid>/cgroup at StartContainer, in the hierarchy
// the registry checks (v1 "pids" where mounted, else unified).
type nriTargets struct {
	cache  *nri.Cache
	v1Pids bool
}

func (a nriTargets) Synced() bool { return a.cache.Synced() }

func (a nriTargets) Container(podUID, name string) (registry.Container, bool) {
	inst, ok := a.cache.Lookup(podUID, name)
	if !ok {
		return registry.Container{}, false
	}
	c := registry.Container{ID: inst.ContainerID, ClaimUID: inst.ClaimUID, ConfigDir: inst.ConfigDir, InitPID: inst.PID}
	if inst.PID != 0 {
		c.Cgroup = inst.Cgroup.Unified
		if a.v1Pids {
			c.Cgroup = inst.Cgroup.PIDsV1
		}
	}
	return c, true
}
