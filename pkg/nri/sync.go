package nri

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/containerd/nri/pkg/api"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// Synchronize rebuilds the cache from the containers the runtime replays, with no API reads
// (it runs under the runtime's request timeout), marks it synced, and removes the directories
// of containers the runtime no longer has (contract §4). It returns no updates.
//
// A replayed container is ours when its env carries a claim UID and our identity env for its
// own pod and name, the claim is prepared on the NRI path, and its mounts include its config
// directory. Running containers get their PID and cgroup at once, so registrations after a
// restart resolve without waiting for events.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	start := time.Now()
	defer p.observe(metrics.HookSynchronize, start)
	byID := make(map[string]*api.PodSandbox, len(pods))
	for _, pod := range pods {
		byID[pod.GetId()] = pod
	}
	// Creation order decides which instance of a name is the newest.
	containers = slices.Clone(containers)
	slices.SortStableFunc(containers, func(a, b *api.Container) int { return cmp.Compare(a.GetCreatedAt(), b.GetCreatedAt()) })
	var instances []Instance
	for _, ctr := range containers {
		if in, ok := p.replayed(byID[ctr.GetPodSandboxId()], ctr); ok {
			instances = append(instances, in)
		}
	}
	p.cache.replace(instances)
	p.metrics.CacheEntries.Set(float64(len(instances)))
	removed := p.removeStaleDirs(instances)
	p.logger.Info("Synchronized with the NRI runtime", "pods", len(pods), "containers", len(containers), "vgpuContainers", len(instances), "staleDirsRemoved", removed)

	p.mu.Lock()
	onSynced := p.onSynced
	p.mu.Unlock()
	if onSynced != nil {
		onSynced()
	}
	return nil, nil
}

// replayed turns a replayed container into a cache instance when it is ours.
func (p *Plugin) replayed(pod *api.PodSandbox, ctr *api.Container) (Instance, bool) {
	if pod == nil {
		return Instance{}, false
	}
	env := parseEnv(ctr.GetEnv())
	if env.claimUID == "" {
		return Instance{}, false
	}
	podUID, name := pod.GetUid(), ctr.GetName()
	if env.conflicting || env.podUID != podUID || env.containerName != name {
		return Instance{}, false
	}
	claim, ok := p.claims.Prepared(env.claimUID)
	if !ok || claim.Path != contract.PathNRI {
		return Instance{}, false
	}
	dirs, err := p.cfg.Layout.ContainerDirs(env.claimUID, podUID, name)
	if err != nil || !slices.ContainsFunc(ctr.GetMounts(), func(m *api.Mount) bool {
		return m.GetSource() == dirs.Config && m.GetDestination() == contract.ContainerConfigDir
	}) {
		return Instance{}, false
	}
	in := Instance{
		ContainerID: ctr.GetId(), PodUID: podUID, PodNamespace: pod.GetNamespace(), PodName: pod.GetName(),
		ContainerName: name, ClaimUID: env.claimUID, ConfigDir: dirs.Config,
	}
	in.Results, in.AdminResults = splitResults(claim, resultsOf(claim, cdiDevices(ctr), env))
	switch ctr.GetState() {
	case api.ContainerState_CONTAINER_RUNNING, api.ContainerState_CONTAINER_PAUSED:
		in.State = StateRunning
		in.PID = int(ctr.GetPid())
		cg, err := readCgroup(p.cfg.ProcRoot, in.PID)
		if err != nil {
			p.logger.Error(err, "No cgroup for a running vGPU container", "pod", klog.KRef(pod.GetNamespace(), pod.GetName()), "container", name)
		}
		in.Cgroup = cg
	case api.ContainerState_CONTAINER_CREATED:
		in.State = StateCreated
	default:
		in.State = StateStopped
	}
	return in, true
}

// removeStaleDirs removes the container directories of NRI-path claims that no replayed
// container owns, and returns how many it removed.
func (p *Plugin) removeStaleDirs(instances []Instance) int {
	type dirKey struct{ claim, pod, name string }
	owned := make(map[dirKey]bool, len(instances))
	for _, in := range instances {
		owned[dirKey{in.ClaimUID, in.PodUID, in.ContainerName}] = true
	}
	removed := 0
	for _, c := range p.claims.List() {
		if c.Path != contract.PathNRI {
			continue
		}
		refs, err := p.cfg.Layout.ListContainerDirs(c.UID)
		if err != nil {
			p.metrics.Failures.WithLabelValues(metrics.HookSynchronize).Inc()
			p.logger.Error(err, "Listing container directories failed", "claim", c.UID)
			continue
		}
		for _, ref := range refs {
			if owned[dirKey{c.UID, ref.PodUID, ref.ContainerName}] {
				continue
			}
			p.removeDirs(metrics.HookSynchronize, Instance{ClaimUID: c.UID, PodUID: ref.PodUID, ContainerName: ref.ContainerName})
			removed++
		}
	}
	return removed
}
