package registry_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	basemetrics "k8s.io/component-base/metrics"

	vgpumetrics "github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// One container's misbehaviour — any number of its connections, any content — may only slow
// that container (contract §5, "Bounds"). Each tenant here is a real process in its own
// cgroup; what is asserted is what the other containers get.

// oneAttempt is a client budget shorter than any wait: the retrying client makes one attempt.
const oneAttempt = time.Nanosecond

// pidsFile creates pids.config in dir, as an earlier registration would have, so that a
// tenant can lock it.
func pidsFile(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "pids.config")
	if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// stopWithin stops s and fails the test when Stop does not return: the bound turns a hang
// into a failure, it is not an asserted time.
func stopWithin(t testing.TB, s *registry.Server) {
	t.Helper()
	done := make(chan struct{})
	go func() { s.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Server.Stop did not return")
	}
}

// answered is how many registrations the server has answered, whatever the status.
func answered(t testing.TB, reg basemetrics.KubeRegistry) int {
	counts, _ := gatherRegistry(t, reg)
	n := 0.0
	for status, c := range counts {
		if status != "NO_RESPONSE" {
			n += c
		}
	}
	return int(n)
}

// TestLockedPIDsConfigAnswersRetry: a container that holds flock(LOCK_SH) on its own
// pids.config gets RETRY for its registrations instead of a server that waits forever; once
// it lets go, it registers; and the server stops while such a registration waits.
func TestLockedPIDsConfigAnswersRetry(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	ctr := rt.NewCgroup(t, h)
	dir := configDir(t, shortDir(t), "c")
	lock := pidsFile(t, dir)
	cs := newContainers()
	cs.set(podA, "app", registry.Container{ConfigDir: dir, Cgroup: ctr.Path}, true)
	s := startServer(t, registry.Config{}, registry.Deps{Containers: cs, Cgroups: &h})
	req := registry.Request{PodUID: podA, ContainerName: "app"}

	holder := rt.StartChild(t, ctr, rt.Spec{Socket: s.Socket(), Lock: lock, Count: 1, Budget: oneAttempt, Request: req})
	rep := holder.Report(t)
	if rep.Statuses[0] != "RETRY" {
		t.Fatalf("registration while the container holds its pids.config: %s %s; want RETRY", rep.Statuses[0], rep.Messages[0])
	}
	holder.Stop()
	after := rt.StartChild(t, ctr, rt.Spec{Socket: s.Socket(), Count: 1, Request: req})
	if rep := after.Report(t); rep.Statuses[0] != "OK" {
		t.Fatalf("registration once the lock is released: %s %s", rep.Statuses[0], rep.Messages[0])
	}

	// A registration waiting for the lock does not hold the server up.
	holder = rt.StartChild(t, ctr, rt.Spec{Socket: s.Socket(), Lock: lock, Count: 1, Budget: oneAttempt, Request: req})
	holder.Ready(t)
	waitFor(t, "the registration to wait for the lock", func() bool { return registry.RequestsInFlight(s) == 1 })
	stopWithin(t, s)
	if rep := holder.Report(t); rep.Statuses[0] != "RETRY" {
		t.Fatalf("registration waiting for the lock when the server stopped: %s %s; want RETRY", rep.Statuses[0], rep.Messages[0])
	}
}

// TestOneTenantCannotTakeEveryRequestSlot: a container holds its claim's pids.config locked
// and sends 300 registrations at once, each naming a different made-up pod; a registration
// of another container is still answered OK, and the server still stops.
func TestOneTenantCannotTakeEveryRequestSlot(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	kube := rt.NewCgroup(t, h)
	tenant := kube.Sub(t, "kubepods/besteffort/pod"+podA+"/ctr-t")
	other := kube.Sub(t, "kubepods/besteffort/pod"+podB+"/ctr-o")
	claimDir := configDir(t, shortDir(t), "claim")
	lock := pidsFile(t, claimDir)
	otherDir := configDir(t, shortDir(t), "other")
	cs := newContainers()
	cs.set(podB, "app", registry.Container{ConfigDir: otherDir, Cgroup: other.Path}, true)
	reg := basemetrics.NewKubeRegistry()
	s := startServer(t, registry.Config{}, registry.Deps{
		Containers: cs, Claims: claims{uuidR: {UID: claim, ReservedFor: []string{podA}, ConfigDir: claimDir}},
		Cgroups: &h, Metrics: vgpumetrics.NewRegistryMetrics(reg),
	})

	const flood = 300
	flooder := rt.StartChild(t, tenant, rt.Spec{Socket: s.Socket(), Lock: lock, Count: flood, Budget: oneAttempt,
		RandomPodUID: true, Request: registry.Request{RegisterUUID: uuidR}})
	flooder.Ready(t)
	waitFor(t, "every registration of the tenant to be in flight or answered", func() bool {
		return registry.RequestsInFlight(s)+answered(t, reg) >= flood
	})
	victim := rt.StartChild(t, other, rt.Spec{Socket: s.Socket(), Count: 1, Request: registry.Request{PodUID: podB, ContainerName: "app"}})
	if rep := victim.Report(t); rep.Statuses[0] != "OK" {
		t.Fatalf("another container's registration during the tenant's flood: %s %s; want OK", rep.Statuses[0], rep.Messages[0])
	}
	stopWithin(t, s)
}

// TestLockWaitsDoNotFillTheNodeBound: a container holds LOCK_SH on its own pids.config and
// has 16 registrations waiting for it, more than the node's bound on requests in flight (8
// here). Waiting for its own lock slows only that container: a registration of a container of
// another pod, and one of another container of the same pod, are answered OK.
func TestLockWaitsDoNotFillTheNodeBound(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	kube := rt.NewCgroup(t, h)
	tenant := kube.Sub(t, "kubepods/besteffort/pod"+podA+"/ctr-t")
	lockedDir := configDir(t, shortDir(t), "locked")
	lock := pidsFile(t, lockedDir)
	cs := newContainers()
	cs.set(podA, "tenant", registry.Container{ConfigDir: lockedDir, Cgroup: tenant.Path}, true)
	others := map[string]rt.Cgroup{}
	for name, pod := range map[string]string{"sibling": podA, "other-pod": podB} {
		cg := kube.Sub(t, "kubepods/besteffort/pod"+pod+"/ctr-"+name)
		cs.set(pod, name, registry.Container{ConfigDir: configDir(t, shortDir(t), name), Cgroup: cg.Path}, true)
		others[name] = cg
	}
	const waiting = 16
	s := startServer(t, registry.Config{MaxRequests: 8, MaxRequestsPerCaller: waiting, LockTimeout: time.Minute},
		registry.Deps{Containers: cs, Cgroups: &h})
	holder := rt.StartChild(t, tenant, rt.Spec{Socket: s.Socket(), Lock: lock, Count: waiting, Once: true,
		Request: registry.Request{PodUID: podA, ContainerName: "tenant"}})
	holder.Ready(t)
	waitFor(t, "the tenant's registrations to reach the server", func() bool {
		return registry.Accepted(s) >= waiting && registry.Reading(s) == 0
	})
	for name, cg := range others {
		pod := podA
		if name == "other-pod" {
			pod = podB
		}
		c := rt.StartChild(t, cg, rt.Spec{Socket: s.Socket(), Count: 1, Once: true, Request: registry.Request{PodUID: pod, ContainerName: name}})
		if rep := c.Report(t); rep.Statuses[0] != "OK" {
			t.Errorf("registration of the %s container while the tenant waits for its lock %d times: %s %s; want OK", name, waiting, rep.Statuses[0], rep.Messages[0])
		}
	}
	stopWithin(t, s)
}

// TestIdleFloodFromOneTenantDoesNotLockOthersOut: one process opens more stalled connections
// than the server's bound on open connections; a registration from another container is
// still answered OK.
func TestIdleFloodFromOneTenantDoesNotLockOthersOut(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	ctr := rt.NewCgroup(t, h)
	dir := configDir(t, shortDir(t), "c")
	cs := newContainers()
	cs.set(podA, "app", registry.Container{ConfigDir: dir, Cgroup: ctr.Path}, true)
	// The stalled connections outlive the victim's whole retry budget.
	s := startServer(t, registry.Config{HeaderTimeout: time.Minute}, registry.Deps{Containers: cs, Cgroups: &h})
	rt.Flood(t, s.Socket(), 1100) // from this test process: one caller
	victim := rt.StartChild(t, ctr, rt.Spec{Socket: s.Socket(), Count: 1, Request: registry.Request{PodUID: podA, ContainerName: "app"}})
	if rep := victim.Report(t); rep.Statuses[0] != "OK" {
		t.Fatalf("registration during another caller's flood of stalled connections: %s %s; want OK", rep.Statuses[0], rep.Messages[0])
	}
	stopWithin(t, s)
}

// TestKnownCallersAreForgotten: a process that connects again and again is identified from
// what the server kept of its first connection (its bounds and peer check stay its own
// container's), and is forgotten once it exits; the server keeps nothing after Stop.
func TestKnownCallersAreForgotten(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	ctr, other := rt.NewCgroup(t, h), rt.NewCgroup(t, h)
	dir := configDir(t, shortDir(t), "c")
	cs := newContainers()
	cs.set(podA, "app", registry.Container{ConfigDir: dir, Cgroup: ctr.Path}, true)
	s := startServer(t, registry.Config{WatchInterval: 10 * time.Millisecond}, registry.Deps{Containers: cs, Cgroups: &h})
	req := registry.Request{PodUID: podA, ContainerName: "app"}
	in := rt.StartChild(t, ctr, rt.Spec{Socket: s.Socket(), Count: 20, Workers: 1, Request: req})
	out := rt.StartChild(t, other, rt.Spec{Socket: s.Socket(), Count: 20, Workers: 1, Request: req})
	for name, c := range map[string]struct {
		ch   *rt.Child
		want string
	}{"in the container": {in, "OK"}, "outside it": {out, "DENIED"}} {
		for i, st := range c.ch.Report(t).Statuses {
			if st != c.want {
				t.Fatalf("registration %d of a process %s: %s, want %s", i, name, st, c.want)
			}
		}
	}
	// Identities are kept only where the kernel pins the caller with SO_PEERPIDFD (Linux 6.5).
	if n, pinned := registry.KnownCallers(s), hasPeerPIDFD(t); pinned && n < 2 || !pinned && n != 0 {
		t.Fatalf("%d known callers after two processes registered 20 times each (SO_PEERPIDFD: %v)", n, pinned)
	}
	in.Stop()
	out.Stop()
	waitFor(t, "the exited processes to be forgotten", func() bool { return registry.KnownCallers(s) == 0 })
	rt.StartChild(t, ctr, rt.Spec{Socket: s.Socket(), Count: 1, Request: req}).Report(t)
	stopWithin(t, s)
	if n := registry.KnownCallers(s); n != 0 {
		t.Fatalf("%d known callers after Stop", n)
	}
}

// hasPeerPIDFD reports whether this kernel offers SO_PEERPIDFD.
func hasPeerPIDFD(t testing.TB) bool {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	fd, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	if err != nil {
		return false
	}
	_ = unix.Close(fd)
	return true
}
