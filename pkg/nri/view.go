package nri

import (
	"slices"
	"sync"

	"github.com/containerd/nri/pkg/api"
	"google.golang.org/protobuf/proto"
)

// runtimeView is what the runtime has told this instance about vGPU containers (those whose env
// carries a claim UID) and their pods, kept whether or not this instance owns the node
// (contract §14). An observer decides nothing, but when it becomes the owner — at a handover or
// because the owner died — it rebuilds its cache from this view exactly as Synchronize would
// from a replay: the runtime replays only when a plugin connects.
type runtimeView struct {
	mu   sync.Mutex
	pods map[string]*api.PodSandbox // by sandbox ID
	ctrs map[string]*api.Container  // vGPU containers by ID
	// replayed is set by the first Synchronize: before it the view holds at most the events of
	// a connection the runtime has not yet replayed its containers to.
	replayed bool
}

func newRuntimeView() *runtimeView {
	return &runtimeView{pods: map[string]*api.PodSandbox{}, ctrs: map[string]*api.Container{}}
}

// isVGPU reports whether the container's env carries a claim UID: only those are kept.
func isVGPU(ctr *api.Container) bool { return parseEnv(ctr.GetEnv()).claimUID != "" }

// replace sets the view to a Synchronize's replay.
func (v *runtimeView) replace(pods []*api.PodSandbox, ctrs []*api.Container) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.pods = make(map[string]*api.PodSandbox, len(pods))
	v.ctrs = map[string]*api.Container{}
	v.replayed = true
	for _, c := range ctrs {
		if isVGPU(c) {
			v.ctrs[c.GetId()] = c
		}
	}
	for _, p := range pods {
		v.pods[p.GetId()] = p
	}
}

// saw records a container as an event carried it (its state, PID and, after creation, the
// mounts and env the adjustment gave it).
func (v *runtimeView) saw(pod *api.PodSandbox, ctr *api.Container) {
	if pod == nil || ctr == nil || !isVGPU(ctr) {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.pods[pod.GetId()] = pod
	if ctr.GetPodSandboxId() == "" {
		ctr.PodSandboxId = pod.GetId()
	}
	v.ctrs[ctr.GetId()] = ctr
}

// stopped marks a container stopped (its event may carry a state the runtime has not set yet).
func (v *runtimeView) stopped(pod *api.PodSandbox, ctr *api.Container) {
	if ctr == nil || !isVGPU(ctr) {
		return
	}
	c := ctr
	c.State, c.Pid = api.ContainerState_CONTAINER_STOPPED, 0
	v.saw(pod, c)
}

// removed forgets a container, and its pod once no container of it is left.
func (v *runtimeView) removed(ctr *api.Container) {
	v.mu.Lock()
	defer v.mu.Unlock()
	old, ok := v.ctrs[ctr.GetId()]
	if !ok {
		return
	}
	delete(v.ctrs, ctr.GetId())
	for _, c := range v.ctrs {
		if c.GetPodSandboxId() == old.GetPodSandboxId() {
			return
		}
	}
	delete(v.pods, old.GetPodSandboxId())
}

// podStopped marks every container of the pod stopped.
func (v *runtimeView) podStopped(pod *api.PodSandbox) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, c := range v.ctrs {
		if c.GetPodSandboxId() == pod.GetId() {
			c.State, c.Pid = api.ContainerState_CONTAINER_STOPPED, 0
		}
	}
}

// snapshot returns the view as a replay: pods and containers (in no particular order; the
// rebuild sorts them), and whether the runtime has replayed its containers to this instance yet
// (a view without a replay is no account of the node).
func (v *runtimeView) snapshot() ([]*api.PodSandbox, []*api.Container, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	// Copies: later events change the view's containers in place.
	pods := make([]*api.PodSandbox, 0, len(v.pods))
	for _, p := range v.pods {
		pods = append(pods, proto.Clone(p).(*api.PodSandbox))
	}
	ctrs := make([]*api.Container, 0, len(v.ctrs))
	for _, c := range v.ctrs {
		ctrs = append(ctrs, proto.Clone(c).(*api.Container))
	}
	slices.SortFunc(ctrs, func(a, b *api.Container) int {
		switch {
		case a.GetCreatedAt() < b.GetCreatedAt():
			return -1
		case a.GetCreatedAt() > b.GetCreatedAt():
			return 1
		}
		return 0
	})
	return pods, ctrs, v.replayed
}

// len is the number of vGPU containers in the view.
func (v *runtimeView) len() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.ctrs)
}
