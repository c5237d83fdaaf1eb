package registry

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"sync"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// claimRegistrations remembers, per claim on the per-claim path, the container cgroups that
// registered for it: pids.config of the claim is the union of their processes (contract §6).
// It lives in memory; a process that starts (a restart, a successor at a handover) rebuilds a
// claim's set at the claim's first registration from the pids.config its predecessor wrote
// (survivors), so that containers that do not register again — long trainers never exec —
// stay in the union. Cgroups whose processes are gone are pruned when the union is computed
// and by the server's periodic watch, and a claim that no longer resolves is forgotten.
type claimRegistrations struct {
	mu     sync.Mutex
	claims map[string]*claimEntry // by claim UID
}

type claimEntry struct {
	registerUUID string
	cgroups      map[string]struct{}
}

func newClaimRegistrations() *claimRegistrations {
	return &claimRegistrations{claims: map[string]*claimEntry{}}
}

func (r *claimRegistrations) add(claimUID, registerUUID, cgroup string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.claims[claimUID]
	if e == nil {
		e = &claimEntry{registerUUID: registerUUID, cgroups: map[string]struct{}{}}
		r.claims[claimUID] = e
	}
	e.cgroups[cgroup] = struct{}{}
}

// known reports whether the claim has a set in this process.
func (r *claimRegistrations) known(claimUID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.claims[claimUID] != nil
}

// pids is the union of the processes of every cgroup registered for the claim, ascending.
// A cgroup that is gone or empty is dropped from the set.
func (r *claimRegistrations) pids(claimUID string, h CgroupHierarchy) ([]int, error) {
	r.mu.Lock()
	e := r.claims[claimUID]
	var cgroups []string
	if e != nil {
		for cg := range e.cgroups {
			cgroups = append(cgroups, cg)
		}
	}
	r.mu.Unlock()
	var all []int
	var gone []string
	for _, cg := range cgroups {
		pids, err := h.PIDs(cg)
		switch {
		case errors.Is(err, fs.ErrNotExist) || err == nil && len(pids) == 0:
			gone = append(gone, cg)
		case err != nil:
			return nil, err
		}
		all = append(all, pids...)
	}
	r.forget(claimUID, gone)
	slices.Sort(all)
	return slices.Compact(all), nil
}

func (r *claimRegistrations) forget(claimUID string, cgroups []string) {
	if len(cgroups) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.claims[claimUID]
	if e == nil {
		return
	}
	for _, cg := range cgroups {
		delete(e.cgroups, cg)
	}
	if len(e.cgroups) == 0 {
		delete(r.claims, claimUID)
	}
}

// prune drops claims that no longer resolve and cgroups that are gone.
func (r *claimRegistrations) prune(claims ClaimResolver, h CgroupHierarchy) {
	r.mu.Lock()
	type item struct{ uid, uuid string }
	var items []item
	for uid, e := range r.claims {
		items = append(items, item{uid, e.registerUUID})
	}
	r.mu.Unlock()
	for _, it := range items {
		if claims == nil {
			r.drop(it.uid)
			continue
		}
		if c, ok := claims.ClaimByRegisterUUID(it.uuid); !ok || c.UID != it.uid {
			r.drop(it.uid)
			continue
		}
		_, _ = r.pids(it.uid, h) // prunes as a side effect
	}
}

func (r *claimRegistrations) drop(claimUID string) {
	r.mu.Lock()
	delete(r.claims, claimUID)
	r.mu.Unlock()
}

// maxSurvivorPods bounds the pods whose holding of a device-plugin share a rebuild asks the
// kubelet about (each is a pod-resources read): a share has one holder at a time.
const maxSurvivorPods = 4

// survivors are the container cgroups of the claim's pids.config (written by the process
// before this one) that still hold processes of a pod that holds the claim: callerPod (checked
// already), a pod of the recorded reservedFor, or, for a share, one its VerifyHolder accepts.
func (s *Server) survivors(claim Claim, callerPod string) []string {
	holds := map[string]bool{callerPod: true}
	asked := 0
	var out []string
	for _, c := range ListedContainers(s.cgroups, claim.ConfigDir, func(pod string) bool {
		held, seen := holds[pod]
		if !seen {
			switch {
			case slices.Contains(claim.ReservedFor, pod):
				held = true
			case claim.VerifyHolder != nil && asked < maxSurvivorPods:
				asked++
				ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HolderTimeout)
				held = claim.VerifyHolder(ctx, pod) == nil
				cancel()
			}
			holds[pod] = held
		}
		return held
	}) {
		out = append(out, c.Cgroup)
	}
	return out
}

// ListedContainer is a container, by pod UID and container cgroup, with a process that a
// pids.config lists.
type ListedContainer struct {
	PodUID, Cgroup string
}

// ListedContainers are the containers whose processes the pids.config of configDir lists and
// that belong to a pod holds accepts, each once, in the file's order. A PID the file lists may
// have been reused by any process of the node since it was written: only the process's cgroup
// now decides, and one outside pods, or of a pod holds refuses, is left out.
func ListedContainers(h CgroupHierarchy, configDir string, holds func(podUID string) bool) []ListedContainer {
	var out []ListedContainer
	for _, pid := range readOwnPIDs(filepath.Join(configDir, contract.PIDsConfigName)) {
		cg, err := h.OfPID(pid)
		if err != nil {
			continue
		}
		pod, ctr, ok := PodOfCgroup(cg)
		if !ok || slices.ContainsFunc(out, func(c ListedContainer) bool { return c.Cgroup == ctr }) || !holds(pod) {
			continue
		}
		out = append(out, ListedContainer{PodUID: pod, Cgroup: ctr})
	}
	return out
}
