package plugin

import (
	"context"
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// targets are what the registry resolves registrations through (nil members answer NOT_FOUND).
type targets struct {
	containers   registry.ContainerResolver
	claims       registry.ClaimResolver
	reservations registry.ReservationReader
}

// registryTargets resolves NRI-path registrations through the NRI cache (none when NRI is off)
// and per-claim ones through the checkpoint, with the API server's reservedFor on a miss.
func registryTargets(n *nriSide, claims checkpointClaims, layout claimdir.Layout) targets {
	t := targets{claims: PerClaimTargets(claims.store, layout), reservations: claims}
	if n != nil {
		t.containers = nriTargets{cache: n.plugin.Cache()}
	}
	return t
}

// startRegistry serves the registry socket (contract §5).
func startRegistry(ctx context.Context, layout claimdir.Layout, t targets, m *metrics.RegistryMetrics) (*registry.Server, error) {
	cgroups, err := registry.DetectCgroupHierarchy("/proc")
	if err != nil {
		return nil, fmt.Errorf("find the cgroup hierarchy for registry peer checks: %w", err)
	}
	if c, ok := t.containers.(nriTargets); ok {
		c.v1Pids = cgroups.V1Pids
		t.containers = c
	}
	return registry.Start(ctx, registry.Config{Socket: layout.RegistrySocket()}, registry.Deps{
		Containers:   t.containers,
		Claims:       t.claims,
		Reservations: t.reservations,
		Cgroups:      &cgroups,
		Metrics:      m,
	})
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

// ClaimReservations is the registry's ReservationReader: the NRI hook's read of a claim's
// reservedFor from the API server (checkpointClaims.ReservedFor), which records a changed list
// in the checkpoint (exported for the integration suite).
func ClaimReservations(store *checkpoint.Store, kube kubernetes.Interface) registry.ReservationReader {
	return newCheckpointClaims(store, kube, nil, klog.Background())
}

// perClaimTargets adapts the checkpoint to the registry's ClaimResolver: the checkpoint is the
// record of which claims took the per-claim path, their register UUIDs and their reservedFor
// pods. Only completed preparations resolve: a container cannot run before Prepare has answered
// the kubelet.
type perClaimTargets struct {
	store  *checkpoint.Store
	layout claimdir.Layout
}

// PerClaimTargets is the registry's ClaimResolver over the checkpoint (exported for the
// integration suite, which runs the registry on its own).
func PerClaimTargets(store *checkpoint.Store, layout claimdir.Layout) registry.ClaimResolver {
	return perClaimTargets{store: store, layout: layout}
}

// ClaimByRegisterUUID scans the prepared claims without copying them; the checkpoint keeps no
// index by UUID, a node holds few claims, and registrations are rare (one per process start).
func (a perClaimTargets) ClaimByRegisterUUID(uuid string) (registry.Claim, bool) {
	if uuid == "" {
		return registry.Claim{}, false
	}
	uid, cl, ok := a.store.Find(func(_ string, c *checkpoint.Claim) bool {
		return c.RegisterUUID == uuid && c.Path == contract.PathPerClaim && c.State == checkpoint.PrepareCompleted
	})
	if !ok {
		return registry.Claim{}, false
	}
	dirs, err := a.layout.PerClaimDirs(uid)
	if err != nil {
		return registry.Claim{}, false
	}
	return registry.Claim{UID: uid, ReservedFor: cl.ReservedFor, ConfigDir: dirs.Config}, true
}
