package registry_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// TestRegisterWritesContainerPIDs: a process in a real container cgroup registers; pids.config
// lists exactly the PIDs of that cgroup and its descendants — in every hierarchy the host has,
// with the target's cgroup given by the cache or derived from its init PID.
func TestRegisterWritesContainerPIDs(t *testing.T) {
	for _, h := range rt.Hierarchies(t) {
		for _, derive := range []bool{false, true} {
			name := h.String()
			if derive {
				name += " (cgroup from init PID)"
			}
			t.Run(name, func(t *testing.T) {
				ctr := rt.NewCgroup(t, h)
				nested := ctr.Sub(t, "nested")
				initProc := rt.StartChild(t, ctr, rt.Spec{}) // the container's "init"
				sidecar := rt.StartChild(t, nested, rt.Spec{})

				dir := configDir(t, shortDir(t), "c")
				target := registry.Container{ID: "ctr-1", ConfigDir: dir, InitPID: initProc.PID}
				if !derive {
					target.Cgroup = ctr.Path
				}
				cs := newContainers()
				cs.set(podA, "app", target, true)
				s := startServer(t, registry.Config{}, registry.Deps{Containers: cs, Cgroups: &h})

				app := rt.StartChild(t, nested, rt.Spec{Socket: s.Socket(), Count: 1,
					Request: registry.Request{PodUID: podA, ContainerName: "app", ClientVersion: "test"}})
				if rep := app.Report(t); rep.Statuses[0] != "OK" {
					t.Fatalf("registration: %s %s", rep.Statuses[0], rep.Messages[0])
				}
				got := readPIDs(t, dir)
				if want := sorted(initProc.PID, sidecar.PID, app.PID); !slices.Equal(got, want) {
					t.Fatalf("pids.config = %v, want %v", got, want)
				}
				st, err := os.Stat(filepath.Join(dir, "pids.config"))
				if err != nil {
					t.Fatal(err)
				}
				if st.Mode().Perm() != 0o644 || st.Sys().(*syscall.Stat_t).Uid != 0 {
					t.Fatalf("pids.config mode %v uid %d, want 0644 root", st.Mode(), st.Sys().(*syscall.Stat_t).Uid)
				}
			})
		}
	}
}

// TestRegisterFromAnotherCgroupIsDenied: the caller is not in the target container's cgroup
// (a sibling, and the parent) → DENIED, nothing written.
func TestRegisterFromAnotherCgroupIsDenied(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	root := rt.NewCgroup(t, h)
	target := root.Sub(t, "target")
	other := root.Sub(t, "other")
	initProc := rt.StartChild(t, target, rt.Spec{})
	dir := configDir(t, shortDir(t), "c")
	cs := newContainers()
	cs.set(podA, "app", registry.Container{ConfigDir: dir, InitPID: initProc.PID}, true)
	s := startServer(t, registry.Config{}, registry.Deps{Containers: cs, Cgroups: &h})

	for name, cg := range map[string]rt.Cgroup{"sibling": other, "parent": root} {
		c := rt.StartChild(t, cg, rt.Spec{Socket: s.Socket(), Count: 1, Request: registry.Request{PodUID: podA, ContainerName: "app"}})
		if rep := c.Report(t); rep.Statuses[0] != "DENIED" {
			t.Fatalf("%s: got %s %s, want DENIED", name, rep.Statuses[0], rep.Messages[0])
		}
	}
	// The test process itself is outside too.
	resp, err := (&registry.Client{Socket: s.Socket()}).RegisterOnce(context.Background(), registry.Request{PodUID: podA, ContainerName: "app"})
	if err != nil || resp.Status != registry.StatusDenied {
		t.Fatalf("test process: %+v, %v", resp, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pids.config")); !os.IsNotExist(err) {
		t.Fatalf("pids.config written for a denied caller: %v", err)
	}
}

// TestReadinessGate: before the first Synchronize a miss is RETRY (with retry_after_ms), and
// the same registration is OK once the cache holds the container; an unknown container after
// the Synchronize is NOT_FOUND; a created but not started one is RETRY.
func TestReadinessGate(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	ctr := rt.NewCgroup(t, h)
	dir := configDir(t, shortDir(t), "c")
	cs := newContainers()
	s := startServer(t, registry.Config{}, registry.Deps{Containers: cs, Cgroups: &h})
	c := &registry.Client{Socket: s.Socket()}
	req := registry.Request{PodUID: podA, ContainerName: "app"}

	resp, err := c.RegisterOnce(context.Background(), req)
	if err != nil || resp.Status != registry.StatusRetry || !resp.HasRetryAfter || resp.RetryAfter <= 0 {
		t.Fatalf("before sync: %+v, %v; want RETRY with retry_after_ms", resp, err)
	}

	cs.set(podA, "app", registry.Container{ConfigDir: dir}, false) // created, not started
	if resp, _ = c.RegisterOnce(context.Background(), req); resp.Status != registry.StatusRetry || !resp.HasRetryAfter {
		t.Fatalf("not started: %+v; want RETRY", resp)
	}

	app := rt.StartChild(t, ctr, rt.Spec{Socket: s.Socket(), Count: 1, Request: req})
	cs.set(podA, "app", registry.Container{ConfigDir: dir, Cgroup: ctr.Path}, true)
	if rep := app.Report(t); rep.Statuses[0] != "OK" {
		t.Fatalf("after sync: %s %s", rep.Statuses[0], rep.Messages[0])
	}
	if got := readPIDs(t, dir); !slices.Equal(got, []int{app.PID}) {
		t.Fatalf("pids.config = %v, want [%d]", got, app.PID)
	}

	resp, err = c.RegisterOnce(context.Background(), registry.Request{PodUID: podB, ContainerName: "app"})
	if err != nil || resp.Status != registry.StatusNotFound {
		t.Fatalf("unknown container after sync: %+v, %v; want NOT_FOUND", resp, err)
	}
}

// TestPerClaimUnion: two containers of two pods share a per-claim claim; each registers by
// its UUID and pids.config holds both. A pod the claim is not reserved for is DENIED, an
// unknown UUID NOT_FOUND, a process outside any pod cgroup DENIED.
func TestPerClaimUnion(t *testing.T) {
	for _, h := range rt.Hierarchies(t) {
		t.Run(h.String(), func(t *testing.T) {
			kube := rt.NewCgroup(t, h)
			ctrA := kube.Sub(t, "kubepods/besteffort/pod"+podA+"/ctr-a")
			// systemd-driver naming for the second pod
			ctrB := kube.Sub(t, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+underscored(podB)+".slice/cri-containerd-b.scope")
			stranger := kube.Sub(t, "kubepods/pod"+uuidR+"/ctr-x")
			dir := configDir(t, shortDir(t), "claim")
			cl := claims{uuidR: {UID: claim, ReservedFor: []string{podA, podB}, ConfigDir: dir}}
			s := startServer(t, registry.Config{}, registry.Deps{Claims: cl, Cgroups: &h})
			req := registry.Request{RegisterUUID: uuidR}

			a := rt.StartChild(t, ctrA, rt.Spec{Socket: s.Socket(), Count: 1, Request: registry.Request{RegisterUUID: uuidR, PodUID: podA, ContainerName: "a"}})
			if rep := a.Report(t); rep.Statuses[0] != "OK" {
				t.Fatalf("pod A: %s %s", rep.Statuses[0], rep.Messages[0])
			}
			b := rt.StartChild(t, ctrB, rt.Spec{Socket: s.Socket(), Count: 1, Request: req})
			if rep := b.Report(t); rep.Statuses[0] != "OK" {
				t.Fatalf("pod B: %s %s", rep.Statuses[0], rep.Messages[0])
			}
			if got, want := readPIDs(t, dir), sorted(a.PID, b.PID); !slices.Equal(got, want) {
				t.Fatalf("pids.config = %v, want %v", got, want)
			}

			x := rt.StartChild(t, stranger, rt.Spec{Socket: s.Socket(), Count: 1, Request: req})
			if rep := x.Report(t); rep.Statuses[0] != "DENIED" {
				t.Fatalf("pod outside reservedFor: %s %s", rep.Statuses[0], rep.Messages[0])
			}
			// The request's own pod_uid plays no part: the cgroup says pod B, which is reserved.
			lying := rt.StartChild(t, ctrB, rt.Spec{Socket: s.Socket(), Count: 1, Request: registry.Request{RegisterUUID: uuidR, PodUID: uuidR}})
			if rep := lying.Report(t); rep.Statuses[0] != "OK" {
				t.Fatalf("pod B naming another pod: %s %s", rep.Statuses[0], rep.Messages[0])
			}
			outside := rt.StartChild(t, kube, rt.Spec{Socket: s.Socket(), Count: 1, Request: req})
			if rep := outside.Report(t); rep.Statuses[0] != "DENIED" {
				t.Fatalf("process outside pods: %s %s", rep.Statuses[0], rep.Messages[0])
			}
			resp, err := (&registry.Client{Socket: s.Socket()}).RegisterOnce(context.Background(), registry.Request{RegisterUUID: claim})
			if err != nil || resp.Status != registry.StatusNotFound {
				t.Fatalf("unknown UUID: %+v, %v", resp, err)
			}
			if got, want := readPIDs(t, dir), sorted(a.PID, b.PID, lying.PID); !slices.Equal(got, want) {
				t.Fatalf("pids.config after refusals = %v, want %v", got, want)
			}

			// Pod A's container goes away; the next registration drops it from the union.
			a.Stop()
			b2 := rt.StartChild(t, ctrB, rt.Spec{Socket: s.Socket(), Count: 1, Request: req})
			if rep := b2.Report(t); rep.Statuses[0] != "OK" {
				t.Fatalf("pod B again: %s %s", rep.Statuses[0], rep.Messages[0])
			}
			if got, want := readPIDs(t, dir), sorted(b.PID, b2.PID, lying.PID); !slices.Equal(got, want) {
				t.Fatalf("pids.config after pod A left = %v, want %v", got, want)
			}
		})
	}
}

func underscored(uid string) string {
	b := []byte(uid)
	for i, c := range b {
		if c == '-' {
			b[i] = '_'
		}
	}
	return string(b)
}

// TestPerClaimUnionSurvivesARestart: A and B register for a per-claim claim; the registry
// stops and a new one starts on the same files (a plugin restart, or the successor of a
// handover); only B registers again. pids.config must still list A, whose long-running process
// never execs again, and not a PID of the file that now belongs to a pod the claim is not for.
func TestPerClaimUnionSurvivesARestart(t *testing.T) {
	for _, h := range rt.Hierarchies(t) {
		t.Run(h.String(), func(t *testing.T) {
			kube := rt.NewCgroup(t, h)
			ctrA := kube.Sub(t, "kubepods/besteffort/pod"+podA+"/ctr-a")
			ctrB := kube.Sub(t, "kubepods/besteffort/pod"+podB+"/ctr-b")
			stranger := kube.Sub(t, "kubepods/pod"+uuidR+"/ctr-x")
			dir := configDir(t, shortDir(t), "claim")
			cl := claims{uuidR: {UID: claim, ReservedFor: []string{podA, podB}, ConfigDir: dir}}
			socket := filepath.Join(shortDir(t), "registry", "registry.sock")
			first := startServer(t, registry.Config{Socket: socket}, registry.Deps{Claims: cl, Cgroups: &h})
			req := registry.Request{RegisterUUID: uuidR}
			a := rt.StartChild(t, ctrA, rt.Spec{Socket: socket, Count: 1, Request: req})
			b := rt.StartChild(t, ctrB, rt.Spec{Socket: socket, Count: 1, Request: req})
			for name, c := range map[string]*rt.Child{"A": a, "B": b} {
				if rep := c.Report(t); rep.Statuses[0] != "OK" {
					t.Fatalf("pod %s: %s %s", name, rep.Statuses[0], rep.Messages[0])
				}
			}
			first.Stop()
			// A process of a pod the claim is not reserved for, listed in the file as if
			// its PID were one that was reused: it must not enter the union.
			x := rt.StartChild(t, stranger, rt.Spec{}) // only sleeps
			appendPIDs(t, dir, x.PID)

			startServer(t, registry.Config{Socket: socket}, registry.Deps{Claims: cl, Cgroups: &h})
			b2 := rt.StartChild(t, ctrB, rt.Spec{Socket: socket, Count: 1, Request: req})
			if rep := b2.Report(t); rep.Statuses[0] != "OK" {
				t.Fatalf("pod B after the restart: %s %s", rep.Statuses[0], rep.Messages[0])
			}
			if got, want := readPIDs(t, dir), sorted(a.PID, b.PID, b2.PID); !slices.Equal(got, want) {
				t.Fatalf("pids.config after the restart = %v, want %v (A kept, the stranger left out)", got, want)
			}
		})
	}
}

// appendPIDs adds PIDs to pids.config as the registry would write them.
func appendPIDs(t *testing.T, dir string, pids ...int) {
	t.Helper()
	p := filepath.Join(dir, "pids.config")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		b = strconv.AppendInt(b, int64(pid), 10)
		b = append(b, '\n')
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
