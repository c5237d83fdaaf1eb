package nri

import (
	"context"

	"github.com/containerd/nri/pkg/api"
	"k8s.io/klog/v2"
)

// Ownership tells the plugin whether this instance owns the node (contract §14): only the owner
// decides containers and touches their directories; an observer only follows the runtime.
// pkg/plugin implements it over the handover's gate and the instance lock.
type Ownership interface {
	// Enter decides one vGPU CreateContainer: owner (serve it, then call done) or not (answer
	// without an adjustment; done does nothing). It holds the call while a handover is being
	// decided, at most until ctx ends; an error fails the container (the kubelet retries).
	Enter(ctx context.Context) (owner bool, done func(), err error)
	// Owns reports, without waiting, whether this instance owns the node or is handing it over
	// (its cache is the node's then): the cleanup hooks remove directories only then.
	Owns() bool
}

// Decisions are the per-container marks with which the owner tells the instance that the
// runtime calls after it that it has decided a CreateContainer (contract §14, "Exactly once").
type Decisions interface {
	// Taken reports whether another instance decided the container (and forgets the mark).
	Taken(containerID string) bool
	// Record marks the container decided by this instance, before the answer is sent.
	Record(containerID string)
	// Forget drops the container's mark (it is removed).
	Forget(containerID string)
}

// soleOwner is the ownership of a plugin that never hands over: it always owns.
type soleOwner struct{}

func (soleOwner) Enter(context.Context) (bool, func(), error) { return true, func() {}, nil }
func (soleOwner) Owns() bool                                  { return true }

// noDecisions records nothing: with one instance nobody else decides.
type noDecisions struct{}

func (noDecisions) Taken(string) bool { return false }
func (noDecisions) Record(string)     {}
func (noDecisions) Forget(string)     {}

// SetOwnership makes the plugin ask o whether it owns the node, and mark its decisions in d.
// Call it before the plugin connects; without it the plugin always owns (one instance).
func (p *Plugin) SetOwnership(o Ownership, d Decisions) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ownership, p.decisions = o, d
}

// claimSource is what the plugin asks about prepared claims now.
func (p *Plugin) claimSource() Claims {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.claims
}

func (p *Plugin) owner() (Ownership, Decisions) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ownership, p.decisions
}

// Own makes this instance's cache the node's: it rebuilds it from what the runtime has told this
// instance (its view), the way Synchronize does from a replay, with claims (the checkpoint the
// new owner just opened). Directories are not swept here, unlike in Synchronize: a container
// that the previous owner adjusted an instant ago may not be in the view yet — its
// PostCreateContainer, which adds it, may still be on its way. Call it before Enter answers
// owner.
//
// An instance the runtime has not synchronized with yet (it took a free lock right after it
// started) has an empty view: the cache stays unsynchronized — the registry answers RETRY — and
// the first Synchronize builds it, as it does at a plain start.
func (p *Plugin) Own(claims Claims) int {
	p.mu.Lock()
	p.claims = claims
	p.mu.Unlock()
	p.ownMu.Lock()
	defer p.ownMu.Unlock()
	pods, ctrs, replayed := p.view.snapshot()
	if !replayed {
		// The runtime's first Synchronize builds the cache, whatever the ownership says when
		// it arrives.
		p.ownOnSync = true
		p.logger.Info("Owning the node before the runtime synchronized with this instance: the container cache waits for its Synchronize")
	}
	// Strays are left to the next Synchronize: the view may not hold a just-created container's
	// adjustment yet.
	instances, _ := p.rebuild(pods, ctrs, replayed)
	p.logger.Info("Rebuilt the container cache from the runtime's events", "vgpuContainers", len(instances))
	return len(instances)
}

// learn adds a container the runtime reports (after its creation, or at its start) that the
// cache does not know and that carries our adjustment: one the previous owner created just
// before the node changed hands.
func (p *Plugin) learn(pod *api.PodSandbox, ctr *api.Container) {
	if _, ok := p.cache.Get(ctr.GetId()); ok {
		return
	}
	in, ok := p.replayed(pod, ctr)
	if !ok {
		return
	}
	if in.State == StateRunning && in.PID > 0 {
		if cg, err := readCgroup(p.cfg.ProcRoot, in.PID); err == nil {
			in.Cgroup = cg
		}
	}
	if p.cache.learn(in) {
		p.metrics.CacheEntries.Set(float64(p.cache.Len()))
		p.logger.V(2).Info("Learned a vGPU container the previous owner created", "pod", klog.KRef(pod.GetNamespace(), pod.GetName()), "container", in.ContainerName, "id", in.ContainerID)
	}
}
