package nri

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// Synchronize rebuilds the cache from the containers the runtime replays, with no API reads
// (it runs under the runtime's request timeout), marks it synced, and removes the directories
// of containers the runtime no longer has (contract §4). Running vGPU containers that the
// runtime created without the plugin's adjustment are stopped after it answers (stray.go). It
// returns no updates.
//
// A replayed container is ours when its env carries a claim UID and our identity env for its
// own pod and name, the claim is prepared on the NRI path, and its mounts include its config
// directory. Running containers get their PID and cgroup at once, so registrations after a
// restart resolve without waiting for events.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	start := time.Now()
	defer p.observe(metrics.HookSynchronize, start)
	ownership, _ := p.owner()
	p.ownMu.Lock()
	p.view.replace(pods, containers)
	owns := ownership.Owns() || p.ownOnSync
	p.ownOnSync = false
	p.ownMu.Unlock()
	if owns {
		instances, strays := p.rebuild(pods, containers, true)
		if len(strays) > 0 {
			// After the answer: a reservation may need an API read (stray.go).
			p.cgroupReads.Add(1)
			go func() {
				defer p.cgroupReads.Done()
				p.stopStrays(strays)
			}()
		}
		removed := p.removeStaleDirs(instances)
		p.logger.Info("Synchronized with the NRI runtime", "pods", len(pods), "containers", len(containers), "vgpuContainers", len(instances), "staleDirsRemoved", removed, "strays", len(strays))
	} else {
		// An observer decides nothing and removes nothing: the owner's cache is the node's.
		p.logger.Info("Synchronized with the NRI runtime as an observer", "pods", len(pods), "containers", len(containers), "vgpuContainers", p.view.len())
	}

	p.mu.Lock()
	onSynced := p.onSynced
	p.mu.Unlock()
	if onSynced != nil {
		onSynced()
	}
	return nil, nil
}

// rebuild replaces the cache with the vGPU containers among a replay (Synchronize's, or this
// instance's view when it becomes the owner), marks it synced when the replay is the runtime's
// (replayed), and returns them, with the running vGPU containers
// that lack the plugin's adjustment (strays; only a runtime's replay is sure of a container's
// mounts, so only Synchronize stops them). Running containers get their cgroups: those the cache
// knew at once, the others read in the background.
func (p *Plugin) rebuild(pods []*api.PodSandbox, containers []*api.Container, replayed bool) ([]Instance, []stray) {
	byID := make(map[string]*api.PodSandbox, len(pods))
	for _, pod := range pods {
		byID[pod.GetId()] = pod
	}
	// Creation order decides which instance of a name is the newest.
	containers = slices.Clone(containers)
	slices.SortStableFunc(containers, func(a, b *api.Container) int { return cmp.Compare(a.GetCreatedAt(), b.GetCreatedAt()) })
	var instances []Instance
	var strays []stray
	for _, ctr := range containers {
		pod := byID[ctr.GetPodSandboxId()]
		if in, ok := p.replayed(pod, ctr); ok {
			instances = append(instances, in)
		} else if s, ok := p.strayOf(pod, ctr); ok {
			strays = append(strays, s)
		}
	}
	unknown := p.keepKnownCgroups(instances)
	p.cache.replace(instances, replayed)
	p.metrics.CacheEntries.Set(float64(len(instances)))
	if len(unknown) > 0 {
		p.cgroupReads.Add(1)
		go func() {
			defer p.cgroupReads.Done()
			p.readCgroups(unknown)
		}()
	}
	return instances, strays
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
	claim, ok := p.claimSource().Prepared(env.claimUID)
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
		in.PID = int(ctr.GetPid()) // its cgroup: resolveCgroups
	case api.ContainerState_CONTAINER_CREATED:
		in.State = StateCreated
	default:
		in.State = StateStopped
	}
	return in, true
}

// cgroupReaders bounds the goroutines that read /proc/<pid>/cgroup after a Synchronize.
const cgroupReaders = 4

// keepKnownCgroups gives each running instance the cgroup the cache already holds for the same
// container ID and PID (a runtime restart: nothing to read again) and returns the instances
// whose cgroup is still to be read.
func (p *Plugin) keepKnownCgroups(instances []Instance) []Instance {
	var unknown []Instance
	for i := range instances {
		in := &instances[i]
		if in.PID <= 0 {
			continue
		}
		if old, ok := p.cache.Get(in.ContainerID); ok && old.PID == in.PID && old.Cgroup != (Cgroup{}) {
			in.Cgroup = old.Cgroup
			continue
		}
		unknown = append(unknown, *in)
	}
	return unknown
}

// readCgroups reads the cgroups of running instances the cache did not know, after Synchronize
// has answered: Synchronize runs under the runtime's request timeout, and on a node with
// thousands of containers reading each /proc/<pid>/cgroup would be most of its time
// (BenchmarkSynchronize10k). An instance is updated only while it still has that PID. Until
// its cgroup is read, the registry derives it from the init PID itself (pkg/registry resolve.go),
// which is what is read here; the PID is the one the runtime has just replayed, so the risk of a
// reused PID is the one any read after the runtime's answer takes.
func (p *Plugin) readCgroups(instances []Instance) {
	work := make(chan Instance)
	var wg sync.WaitGroup
	for range min(cgroupReaders, len(instances)) {
		wg.Go(func() {
			for in := range work {
				cg, err := readCgroup(p.cfg.ProcRoot, in.PID)
				if err != nil {
					p.logger.Error(err, "No cgroup for a running vGPU container", "pod", klog.KRef(in.PodNamespace, in.PodName), "container", in.ContainerName)
					continue
				}
				p.cache.update(in.ContainerID, func(cur *Instance) {
					if cur.PID == in.PID && cur.Cgroup == (Cgroup{}) {
						cur.Cgroup = cg
					}
				})
			}
		})
	}
	for _, in := range instances {
		work <- in
	}
	close(work)
	wg.Wait()
}

// removeStaleDirs removes the container directories of NRI-path claims that no replayed
// container owns, and returns how many it removed.
func (p *Plugin) removeStaleDirs(instances []Instance) int {
	type dirKey struct{ claim, pod, name string }
	owned := make(map[dirKey]bool, len(instances))
	for _, in := range instances {
		owned[dirKey{in.ClaimUID, in.PodUID, in.ContainerName}] = true
	}
	var uids []string
	for _, c := range p.claimSource().List() {
		if c.Path == contract.PathNRI {
			uids = append(uids, c.UID)
		}
	}
	dirs, err := p.cfg.Layout.ListContainerDirsOf(uids)
	if err != nil {
		p.metrics.Failures.WithLabelValues(metrics.HookSynchronize).Inc()
		p.logger.Error(err, "Listing container directories failed")
	}
	removed := 0
	for _, uid := range uids {
		for _, ref := range dirs[uid] {
			if owned[dirKey{uid, ref.PodUID, ref.ContainerName}] {
				continue
			}
			p.removeDirs(metrics.HookSynchronize, Instance{ClaimUID: uid, PodUID: ref.PodUID, ContainerName: ref.ContainerName})
			removed++
		}
	}
	return removed
}
