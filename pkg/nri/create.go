package nri

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// Mount options of the per-container directories (contract §4), as for the CDI mounts.
var (
	roMount = []string{"ro", "nosuid", "nodev", "bind"}
	rwMount = []string{"rw", "nosuid", "nodev", "bind"}
)

// rejection is a container that carries a claim UID but gets no adjustment (contract §4, §8).
type rejection struct {
	reason string
	detail string
}

func (r *rejection) Error() string { return r.reason + ": " + r.detail }

func reject(reason, format string, args ...any) error {
	return &rejection{reason: reason, detail: fmt.Sprintf(format, args...)}
}

// CreateContainer gives a vGPU container of a claim prepared on the NRI path its directory
// and identity (contract §4). A container without a non-empty MANAGER_VGPU_CLAIM_UID returns
// at once with no adjustment. An invalid one gets no adjustment and a counted rejection; the
// collisions and the invariant of contract §3, and errors, fail the container.
func (p *Plugin) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	env := parseEnv(ctr.GetEnv())
	if env.claimUID == "" {
		return nil, nil, nil
	}
	if !p.inflight.enter() {
		// An instance that does not own the node has nothing to answer: the owner decides.
		if ownership, _ := p.owner(); !ownership.Owns() {
			return nil, nil, nil
		}
		// Shutting down: the connection closes once the requests in flight are answered, and a
		// request that comes now would be in flight then. Failing it is safe (the kubelet
		// retries the container; the next plugin instance answers); creating it without us is
		// not.
		p.metrics.Failures.WithLabelValues(metrics.HookCreateContainer).Inc()
		return nil, nil, errDraining
	}
	defer p.inflight.leave()
	// Another instance may own the node, or be taking it over (contract §14): only the owner
	// decides, and it decides once even when ownership moves between its call and the other
	// instance's.
	ownership, decisions := p.owner()
	owner, done, err := ownership.Enter(ctx)
	if err != nil {
		p.metrics.Failures.WithLabelValues(metrics.HookCreateContainer).Inc()
		return nil, nil, err
	}
	defer done()
	// The mark of an instance called before this one is read (and removed) whatever this one is.
	if taken := decisions.Taken(ctr.GetId()); !owner || taken {
		return nil, nil, nil
	}
	decisions.Record(ctr.GetId())
	generation := p.cache.Generation()
	start := time.Now()
	defer p.observe(metrics.HookCreateContainer, start)
	logger := p.logger.WithValues("pod", klog.KRef(pod.GetNamespace(), pod.GetName()), "podUID", pod.GetUid(), "container", ctr.GetName())
	adjust, err := p.createContainer(ctx, pod, ctr, env, generation)
	var rej *rejection
	switch {
	case errors.As(err, &rej):
		p.metrics.Rejections.WithLabelValues(rej.reason).Inc()
		logger.Info("Creating the container without vGPU directories", "reason", rej.reason, "detail", rej.detail)
		return nil, nil, nil
	case err != nil:
		p.metrics.Failures.WithLabelValues(metrics.HookCreateContainer).Inc()
		logger.Error(err, "Failing the vGPU container")
		return nil, nil, err
	}
	p.metrics.Injections.Inc()
	p.metrics.CacheEntries.Set(float64(p.cache.Len()))
	logger.V(2).Info("Gave the container its vGPU directories", "id", ctr.GetId())
	return adjust, nil, nil
}

func (p *Plugin) createContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, env vgpuEnv, generation uint64) (*api.ContainerAdjustment, error) {
	podUID, name, uid := pod.GetUid(), ctr.GetName(), env.claimUID
	if env.conflicting {
		return nil, reject(contract.RejectInvalidValue, "%s has two different values", contract.EnvClaimUID)
	}
	// Names are validated before any path is built from them.
	for _, err := range []error{contract.ValidateUID(uid), contract.ValidateUID(podUID), contract.ValidateContainerName(name)} {
		if err != nil {
			return nil, reject(contract.RejectInvalidValue, "%v", err)
		}
	}
	claim, ok := p.claimSource().Prepared(uid)
	if !ok || !claim.Completed {
		return nil, reject(contract.RejectClaimNotPrepared, "claim %s is not prepared on this node", uid)
	}
	if claim.Path != contract.PathNRI {
		return nil, reject(contract.RejectWrongPath, "claim %s was prepared on the %s path", claimRef(claim), claim.Path)
	}
	if claim.Quarantined != "" {
		return nil, fmt.Errorf("claim %s could not be restored when the plugin started (%s); the container fails until a Prepare of the claim restores it", claimRef(claim), claim.Quarantined)
	}
	devices := cdiDevices(ctr)
	if len(devices) > 0 {
		if err := checkCollisions(p.cfg.DriverName, p.claimSource(), devices); err != nil {
			return nil, err
		}
		if !slices.Contains(devices, claim.CommonCDIDevice) {
			return nil, reject(contract.RejectInvalidValue, "the container's CDI devices do not include %s of claim %s", claim.CommonCDIDevice, claimRef(claim))
		}
	}
	if err := p.checkReserved(ctx, claim, podUID); err != nil {
		return nil, err
	}

	dirs, err := p.cfg.Layout.ContainerDirs(uid, podUID, name)
	if err != nil {
		return nil, reject(contract.RejectInvalidValue, "%v", err)
	}
	in := Instance{
		ContainerID: ctr.GetId(), PodUID: podUID, PodNamespace: pod.GetNamespace(), PodName: pod.GetName(),
		ContainerName: name, ClaimUID: uid, ConfigDir: dirs.Config, State: StateCreated,
	}
	in.Results, in.AdminResults = splitResults(claim, resultsOf(claim, devices, env))
	if err := p.cache.add(in, generation); err != nil {
		var inUse *ResultInUseError
		if errors.As(err, &inUse) {
			r := claim.Results[inUse.Result]
			return nil, fmt.Errorf("request %q of claim %s (device %s) %w; two running containers must never share one allocation result", r.Request, claimRef(claim), r.Device, err)
		}
		return nil, err
	}
	if _, err := p.cfg.Layout.EnsureContainerDirs(uid, podUID, name); err != nil {
		p.undo(in)
		return nil, fmt.Errorf("create directories of container %q for claim %s: %w", name, claimRef(claim), err)
	}
	config := containerConfig(claim, in)
	if err := p.cfg.Layout.WriteConfig(dirs, config.Encode()); err != nil {
		p.undo(in)
		return nil, fmt.Errorf("write %s of container %q for claim %s: %w", contract.ContainerConfigName, name, claimRef(claim), err)
	}
	// The runtime has given up on an answer after its deadline (and, depending on its failure
	// policy, created the container without us): leave nothing behind for it.
	if err := ctx.Err(); err != nil {
		p.undo(in)
		return nil, fmt.Errorf("container %q of claim %s: the runtime's deadline passed: %w", name, claimRef(claim), err)
	}

	adjust := &api.ContainerAdjustment{}
	adjust.AddMount(&api.Mount{Source: dirs.Config, Destination: contract.ContainerConfigDir, Type: "bind", Options: roMount})
	// A container of admin-access results only runs unlimited (its vgpu.config has no limit):
	// the library keeps no ledger and no core buckets for it, so it gets no writable directory.
	if len(in.Results) > 0 || len(in.AdminResults) == 0 {
		adjust.AddMount(&api.Mount{Source: dirs.VGPULock, Destination: contract.ContainerVGPULockDir, Type: "bind", Options: rwMount})
		adjust.AddMount(&api.Mount{Source: dirs.VMemNode, Destination: contract.ContainerVMemNodeDir, Type: "bind", Options: rwMount})
	}
	adjust.AddEnv(contract.EnvPodUID, podUID)
	adjust.AddEnv(contract.EnvContainerName, name)
	if p.cfg.SetNvidiaVisibleDevices {
		uuids := make([]string, len(config.GPUs))
		for i, g := range config.GPUs {
			uuids[i] = g.UUID
		}
		adjust.AddEnv(contract.EnvNvidiaVisible, strings.Join(uuids, ","))
	}
	return adjust, nil
}

// containerConfig is what the container may use (contract §4a): the GPUs of the results it
// references, each once, with their limits (none for admin access), and its NRI identity. Two
// results on one GPU never reach here (checkCollisions), so a GPU's limits are those of its one
// result.
func containerConfig(claim Claim, in Instance) contract.ContainerConfig {
	c := contract.ContainerConfig{ClaimUID: claim.UID, PodUID: in.PodUID, ContainerName: in.ContainerName}
	used := slices.Sorted(slices.Values(slices.Concat(in.Results, in.AdminResults)))
	for _, i := range used {
		r := claim.Results[i]
		if slices.ContainsFunc(c.GPUs, func(g contract.ContainerGPU) bool { return g.UUID == r.GPUUUID }) {
			continue
		}
		g := contract.ContainerGPU{Index: r.Index, UUID: r.GPUUUID, MemoryBytes: r.MemoryBytes, Cores: r.Cores}
		if r.AdminAccess {
			g.MemoryBytes, g.Cores = 0, 0 // "0 0": pass-through (contract §4a)
		}
		c.GPUs = append(c.GPUs, g)
	}
	return c
}

// checkReserved checks that the claim is reserved for the pod: the recorded list first, then
// one read from the API server (a second pod may share a claim the kubelet does not prepare
// again). An API error fails the container, so that the kubelet retries it.
func (p *Plugin) checkReserved(ctx context.Context, claim Claim, podUID string) error {
	if slices.Contains(claim.ReservedFor, podUID) {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, p.cfg.RefreshTimeout)
	defer cancel()
	reserved, err := p.claimSource().ReservedFor(rctx, claim.UID)
	if err != nil {
		return fmt.Errorf("read claim %s to check that pod %s is reserved for it: %w", claimRef(claim), podUID, err)
	}
	if !slices.Contains(reserved, podUID) {
		return reject(contract.RejectPodNotReserved, "claim %s is not reserved for pod %s", claimRef(claim), podUID)
	}
	return nil
}

// undo removes what a failed CreateContainer recorded: its own cache entry, and the
// directory when no other instance of the name has it.
func (p *Plugin) undo(in Instance) {
	if _, last, ok := p.cache.remove(in.ContainerID); ok && last {
		p.removeDirs(metrics.HookCreateContainer, in)
	}
}
