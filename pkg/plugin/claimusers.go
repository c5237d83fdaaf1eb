package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce/podevents"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// stopWait bounds how long stopping a stale claim's containers waits for their processes to go.
const stopWait = 5 * time.Second

// claimUsers is the driver's view of the containers that run with its claims
// (driver.ClaimUsers): on the NRI path the cache's instances that have not stopped; on the
// per-claim path the container cgroups of the claim's pids.config that still have processes in
// a pod the claim was reserved for. Nothing of it is a file a container can write.
type claimUsers struct {
	cache   *nri.Cache // nil without NRI
	layout  claimdir.Layout
	cgroups *registry.CgroupHierarchy // nil: the hierarchy was not found (per-claim path unknown)
	warn    func(namespace, pod, podUID, reason, message string)
}

var _ driver.ClaimUsers = (*claimUsers)(nil)

// pluginEvents starts the recorder of the kubelet plugin's own events on pods for an ownership
// term; its events go out until ctx ends. Nil without an API client.
func (p *Plugin) pluginEvents(ctx context.Context) *podevents.Recorder {
	if p.deps.KubeClient == nil {
		return nil
	}
	events := podevents.NewFor(p.deps.KubeClient, p.cfg.NodeName, podevents.PluginComponent)
	context.AfterFunc(ctx, events.Shutdown)
	return events
}

// claimUsers builds the view for an ownership term; its Warning events go through events (none
// when nil).
func (p *Plugin) claimUsers(layout claimdir.Layout, cgroups *registry.CgroupHierarchy, events *podevents.Recorder) *claimUsers {
	u := &claimUsers{layout: layout, cgroups: cgroups}
	if p.nri != nil {
		u.cache = p.nri.plugin.Cache()
	}
	if events != nil {
		u.warn = events.WarnPod
	}
	return u
}

func (u *claimUsers) Users(uid string, c checkpoint.Claim) ([]driver.ClaimUser, error) {
	var out []driver.ClaimUser
	if c.Path == contract.PathPerClaim {
		if u.cgroups == nil {
			return nil, nil
		}
		dirs, err := u.layout.PerClaimDirs(uid)
		if err != nil {
			return nil, err
		}
		for _, lc := range registry.ListedContainers(*u.cgroups, dirs.Config, func(pod string) bool { return slices.Contains(c.ReservedFor, pod) }) {
			out = append(out, driver.ClaimUser{Namespace: c.Namespace, PodUID: lc.PodUID, Cgroups: []string{lc.Cgroup}})
		}
		return out, nil
	}
	if u.cache == nil {
		return nil, nil
	}
	if !u.cache.Synced() {
		return nil, errors.New("the NRI cache has not been rebuilt by the runtime yet")
	}
	for _, in := range liveInstances(u.cache) {
		if in.ClaimUID != uid {
			continue
		}
		user := driver.ClaimUser{Namespace: in.PodNamespace, Pod: in.PodName, PodUID: in.PodUID, Container: in.ContainerName}
		if cg := u.cgroupOf(in); cg != "" {
			user.Cgroups = []string{cg}
		}
		out = append(out, user)
	}
	return out, nil
}

func (u *claimUsers) cgroupOf(in nri.Instance) string {
	if u.cgroups == nil {
		return ""
	}
	if u.cgroups.V1Pids {
		return in.Cgroup.PIDsV1
	}
	return in.Cgroup.Unified
}

// Stop SIGKILLs every process of the users' cgroups (each pinned by a pidfd and checked to be
// in its cgroup still, enforce.Killer) and waits until the cgroups are empty. A user without a
// known cgroup (created, not started) cannot be stopped from here: an error, the claim is kept.
func (u *claimUsers) Stop(ctx context.Context, users []driver.ClaimUser) error {
	if u.cgroups == nil {
		return errors.New("the node's cgroup hierarchy is unknown")
	}
	k := enforce.Killer{Cgroups: u.cgroups}
	var cgroups []string
	for _, user := range users {
		if len(user.Cgroups) == 0 {
			return fmt.Errorf("container %s has no process yet", user)
		}
		cgroups = append(cgroups, user.Cgroups...)
	}
	ctx, cancel := context.WithTimeout(ctx, stopWait)
	defer cancel()
	for {
		left := 0
		for _, cg := range cgroups {
			pids, err := u.cgroups.PIDs(cg)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			for _, pid := range pids {
				left++
				now, err := u.cgroups.OfPID(pid)
				if err == nil && registry.Within(now, cg) {
					_ = k.Kill(pid, now) // gone meanwhile, or moved: seen again next round
				}
			}
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d processes of %v still run after %s", left, cgroups, stopWait)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (u *claimUsers) Warn(user driver.ClaimUser, reason, message string) {
	if u.warn != nil && user.Pod != "" && user.PodUID != "" {
		u.warn(user.Namespace, user.Pod, user.PodUID, reason, message)
	}
}
