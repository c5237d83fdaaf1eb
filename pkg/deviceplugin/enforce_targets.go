package deviceplugin

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// pendingPod is what targetSource.podOf answers, while a pod that holds shares has no known UID
// yet (the API server did not answer), for a process of a pod that no target has: the pending
// target, unlimited on every GPU, holds it, so that a pod that cannot be named yet is neither
// enforced nor taken for foreign (and killed, with --foreign-gpu-process=kill) until it can.
// Not a UUID: no pod has it.
const pendingPod = "unresolved"

// targetRefresh is the shortest interval between two listings of the kubelet's pods for the
// enforcer's targets.
const targetRefresh = time.Second

// podGetTimeout bounds one read of a pod's UID.
const podGetTimeout = 2 * time.Second

// target is the enforcer's target of one pod whose containers hold shares (contract §15): the
// pod is matched by its UID (the kubelet's pod cgroup, registry.PodOfCgroup), never by a file a
// container can write. Its limit on a GPU is the sum of its containers' merged shares there
// (allocation: k shares of a GPU are k times a share's memory and cores, as in the container's
// vgpu.config), its core limit the sum of their cores, none where a share's cores are unlimited
// or the sum reaches 100. Every share has a memory limit, so every target must register. The
// containers of one pod are one target: a process's pod is known from its cgroup, its container
// only from a record the registry keeps of registered containers, and a process that bypassed
// the library never registered. ok is false when no container holds a share of this node (the
// shares were reconfigured: the keeper logs it).
func (inv *Inventory) target(layout claimdir.Layout, pod podRef, uid string, sets []heldSet) (t enforce.Target, ok bool) {
	t = enforce.Target{Key: "pod/" + uid, Namespace: pod.namespace, Pod: pod.name, PodUID: uid, Pods: []string{uid},
		Limits: map[string]uint64{}, CoreLimits: map[string]uint32{}, MustRegister: true}
	noCores := map[string]bool{}
	var containers, leads []string
	for _, s := range sets {
		al, err := inv.allocation(s.ids, nil)
		if err != nil {
			continue
		}
		dirs, err := layout.PerClaimDirs(al.lead.UID)
		if err != nil {
			continue
		}
		if t.ConfigDir == "" {
			t.ConfigDir = dirs.Config
		} else {
			t.ConfigDirs = append(t.ConfigDirs, dirs.Config)
		}
		containers, leads = append(containers, s.container), append(leads, al.lead.ID)
		for _, g := range al.gpus {
			t.Limits[g.UUID] += uint64(g.MemoryBytes)
			if g.Cores == 0 {
				noCores[g.UUID] = true
			} else {
				t.CoreLimits[g.UUID] += uint32(g.Cores)
			}
		}
	}
	for uuid, c := range t.CoreLimits {
		if noCores[uuid] || c >= unlimitedCores {
			delete(t.CoreLimits, uuid)
		}
	}
	t.Container, t.Claim = strings.Join(containers, ","), strings.Join(leads, ",")
	return t, len(leads) > 0
}

// targetSource is the enforcer's view of the containers that hold shares, rebuilt every period
// from the kubelet's pod-resources API (which container of which pod holds which shares; listed
// from Allocate on, before the container starts) and the API server (the UID of a pod by name,
// read once per pod and kept while the kubelet lists the name).
type targetSource struct {
	inv     *Inventory
	layout  claimdir.Layout
	holders *holders
	logger  logr.Logger

	// uids is refresh's own: the UID of each pod the kubelet listed at the last refresh ("" for
	// a pod the API server no longer has); unread the pods whose UID could not be read since
	// (logged once each).
	uids   map[podRef]string
	unread map[podRef]bool

	mu      sync.Mutex
	targets []enforce.Target
	known   map[string]bool // the targets' pod UIDs
	built   bool            // a refresh has listed the kubelet's pods
	pending bool            // the latest refresh could not read the UID of a pod that holds shares
	// unknown are the pod UIDs podOf was asked about that no target has, since the last refresh;
	// reread are those that made a refresh read every pod's UID again. A pod re-created under
	// its name between two refreshes has a new UID that the kept one hides: the first process
	// of it that the enforcer sees makes the next refresh read every UID again (once per
	// unknown pod, not every pass while one is seen).
	unknown, reread map[string]bool
	failing         bool // the latest refresh failed (logged once per failure streak)
	// kick asks run for a refresh now: a process of a pod no target has was seen for the first
	// time (a pod that started since the last listing, once a second, must not wait for it).
	kick chan struct{}
}

func newTargetSource(inv *Inventory, layout claimdir.Layout, h *holders, logger logr.Logger) *targetSource {
	return &targetSource{inv: inv, layout: layout, holders: h, logger: logger, uids: map[podRef]string{}, unread: map[podRef]bool{},
		known: map[string]bool{}, unknown: map[string]bool{}, reread: map[string]bool{}, kick: make(chan struct{}, 1)}
}

// refresh rebuilds the targets. When the kubelet does not answer it keeps the last ones: no
// container starts or ends without it.
func (s *targetSource) refresh(ctx context.Context) error {
	resp, err := s.holders.list(ctx)
	if err != nil {
		return err
	}
	named := map[podRef]int{}
	for _, p := range resp.GetPodResources() {
		named[podRef{p.GetNamespace(), p.GetName()}]++
	}
	var order []podRef
	byPod := map[podRef][]heldSet{}
	for _, set := range s.holders.heldSets(resp) {
		if byPod[set.pod] == nil {
			order = append(order, set.pod)
		}
		byPod[set.pod] = append(byPod[set.pod], set)
	}
	s.mu.Lock()
	rereadAll := false
	for uid := range s.unknown {
		rereadAll = rereadAll || !s.reread[uid]
	}
	s.reread, s.unknown = s.unknown, map[string]bool{}
	s.mu.Unlock()

	uids := make(map[podRef]string, len(order))
	var targets []enforce.Target
	known := map[string]bool{}
	pending := false
	for _, pod := range order {
		uid, ok := s.uids[pod]
		// Read again when the kubelet lists the name twice (a pod re-created under its name
		// while the old one stops: the API server has the new one) or a process of a pod no
		// target has was seen.
		if !ok || named[pod] > 1 || rereadAll {
			read, err := s.podUID(ctx, pod)
			switch {
			case err == nil:
				uid = read
				delete(s.unread, pod)
			case ok:
				pending = true // the UID kept, and a re-created pod's pending meanwhile
			default:
				pending = true
				if !s.unread[pod] {
					s.unread[pod] = true
					s.logger.Info("The UID of a pod that holds shares cannot be read: its processes are not enforced until it is", "pod", pod.namespace+"/"+pod.name, "err", err)
				}
				continue
			}
		}
		uids[pod] = uid
		if uid == "" {
			continue // deleted from the API server: its processes are foreign
		}
		if t, ok := s.inv.target(s.layout, pod, uid, byPod[pod]); ok {
			targets = append(targets, t)
			known[uid] = true
		}
	}
	if pending {
		all := map[string]bool{}
		for _, g := range s.inv.GPUs {
			all[g.Device.UUID] = true
		}
		targets = append(targets, enforce.Target{Key: "pending", Pods: []string{pendingPod}, Unlimited: all})
	}
	s.uids = uids
	for pod := range s.unread {
		if byPod[pod] == nil {
			delete(s.unread, pod)
		}
	}
	s.mu.Lock()
	s.targets, s.known, s.pending, s.built = targets, known, pending, true
	s.mu.Unlock()
	return nil
}

// podUID reads a pod's UID from the API server; "" when it has no such pod.
func (s *targetSource) podUID(ctx context.Context, pod podRef) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, podGetTimeout)
	defer cancel()
	p, err := s.holders.kube.CoreV1().Pods(pod.namespace).Get(ctx, pod.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("read pod %s/%s: %w", pod.namespace, pod.name, err)
	}
	return string(p.UID), nil
}

// run refreshes every period, and when kicked, until ctx ends.
func (s *targetSource) run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		err := s.refresh(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !s.failing:
			s.logger.Error(err, "The enforcer cannot list the kubelet's pods; it keeps the containers it last knew")
		case err == nil && s.failing:
			s.logger.Info("The enforcer lists the kubelet's pods again")
		}
		s.failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
	}
}

// ready reports whether the targets are known (enforce.Deps.Ready): before the first refresh
// every process would look foreign.
func (s *targetSource) ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.built
}

// snapshot is the targets (enforce.Deps.Targets); the enforcer does not change them.
func (s *targetSource) snapshot() []enforce.Target {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.targets
}

// podOf is the pod UID of a container cgroup (enforce.Deps.PodOf): registry.PodOfCgroup, the
// kubelet's naming of pod cgroups; pendingPod for a pod no target has while one is pending.
func (s *targetSource) podOf(cgroup string) (string, bool) {
	pod, _, ok := registry.PodOfCgroup(cgroup)
	if !ok {
		return "", false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known[pod] {
		return pod, true
	}
	if !s.unknown[pod] && !s.reread[pod] {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	s.unknown[pod] = true
	if s.pending {
		return pendingPod, true
	}
	return pod, true
}
