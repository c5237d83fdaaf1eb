package plugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// TestClaimUsersPerClaim: on the per-claim path, the reconciliation's view of a claim's
// containers comes from real processes in real cgroups. The containers whose processes its
// pids.config lists, in a pod the claim is reserved for, use it; a listed PID now in another
// pod's cgroup (reused) does not; Stop kills the users' processes and returns once they are
// gone, leaving the other pod's process alone.
func TestClaimUsersPerClaim(t *testing.T) {
	const (
		claimUID = "c1a10000-0000-4000-8000-0000000000aa"
		podA     = "90d00000-0000-4000-8000-0000000000a1"
		podX     = "90d00000-0000-4000-8000-0000000000ff"
	)
	for _, h := range rt.Hierarchies(t) {
		t.Run(h.String(), func(t *testing.T) {
			kube := rt.NewCgroup(t, h)
			ctrA := kube.Sub(t, "kubepods/besteffort/pod"+podA+"/ctr-a")
			ctrX := kube.Sub(t, "kubepods/besteffort/pod"+podX+"/ctr-x")
			a := rt.StartChild(t, ctrA, rt.Spec{}) // only sleeps, as a trainer between steps
			x := rt.StartChild(t, ctrX, rt.Spec{})
			state, err := os.MkdirTemp("/tmp", "vgu-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.RemoveAll(state) })
			layout := claimdir.Layout{StateDir: state}
			if err := os.MkdirAll(filepath.Join(state, "claims", claimUID), 0o755); err != nil {
				t.Fatal(err)
			}
			dirs, err := layout.EnsurePerClaimDirs(claimUID)
			if err != nil {
				t.Fatal(err)
			}
			pids := strconv.Itoa(a.PID) + "\n" + strconv.Itoa(x.PID) + "\n"
			if err := os.WriteFile(filepath.Join(dirs.Config, contract.PIDsConfigName), []byte(pids), 0o644); err != nil {
				t.Fatal(err)
			}
			u := &claimUsers{layout: layout, cgroups: &h}
			c := checkpoint.Claim{Namespace: "team", Name: "share", Path: contract.PathPerClaim, ReservedFor: []string{podA}}
			users, err := u.Users(claimUID, c)
			if err != nil {
				t.Fatal(err)
			}
			if len(users) != 1 || users[0].PodUID != podA || !slices.Equal(users[0].Cgroups, []string{ctrA.Path}) {
				t.Fatalf("users %+v, want pod A's container %s only", users, ctrA.Path)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := u.Stop(ctx, users); err != nil {
				t.Fatal(err)
			}
			if users, err := u.Users(claimUID, c); err != nil || len(users) != 0 {
				t.Errorf("users after Stop: %+v, %v; want none", users, err)
			}
			if err := syscallKill0(x.PID); err != nil {
				t.Errorf("the other pod's process %d was hit: %v", x.PID, err)
			}
		})
	}
}

// syscallKill0 reports whether the process exists (signal 0).
func syscallKill0(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Signal(syscall.Signal(0))
}
