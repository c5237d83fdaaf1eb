package registry_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	basemetrics "k8s.io/component-base/metrics"

	vgpumetrics "github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// Bounds per pod (contract §5, "Bounds"): a pod's containers share its bounds on open
// connections and on requests in flight, so many containers of one pod cannot fill the
// node's; past the node's bound on open connections a newcomer sheds the newest stalled
// connection of the pod that holds the most.

// podCgroup is the cgroup of container ctr of pod, below kube.
func podCgroup(t testing.TB, kube rt.Cgroup, pod, ctr string) rt.Cgroup {
	return kube.Sub(t, "kubepods/besteffort/pod"+pod+"/"+ctr)
}

// TestPodBoundOnOpenConnections: two containers of one pod hold the pod's 6 stalled
// connections, each within its own bound of 4; a third container of that pod is answered BUSY
// without being read, and a container of another pod is served.
func TestPodBoundOnOpenConnections(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	kube := rt.NewCgroup(t, h)
	cs := newContainers()
	cs.set(podB, "x", registry.Container{}, true) // synced; requests naming pod A find nothing
	s := startServer(t, registry.Config{MaxOpenConnsPerCaller: 4, MaxOpenConnsPerPod: 6, HeaderTimeout: time.Minute},
		registry.Deps{Containers: cs, Cgroups: &h})
	for i, n := range []int{4, 2} {
		rt.StartChild(t, podCgroup(t, kube, podA, fmt.Sprint("stall-", i)), rt.Spec{Socket: s.Socket(), Stall: n}).Ready(t)
	}
	waitFor(t, "the pod's 6 stalled connections to be read", func() bool { return registry.Reading(s) == 6 })
	req := registry.Request{PodUID: podA, ContainerName: "app"}
	third := rt.StartChild(t, podCgroup(t, kube, podA, "third"), rt.Spec{Socket: s.Socket(), Count: 1, Once: true, Request: req})
	if rep := third.Report(t); rep.Statuses[0] != "BUSY" || !strings.Contains(rep.Messages[0], "this pod") || rep.RetryAfterMs[0] <= 0 {
		t.Errorf("third container of the pod: %s %q (retry_after_ms %d); want BUSY naming the pod, with retry_after_ms",
			rep.Statuses[0], rep.Messages[0], rep.RetryAfterMs[0])
	}
	other := rt.StartChild(t, podCgroup(t, kube, podB, "app"), rt.Spec{Socket: s.Socket(), Count: 1, Once: true, Request: req})
	if rep := other.Report(t); rep.Statuses[0] != "NOT_FOUND" {
		t.Errorf("container of another pod: %s %s; want NOT_FOUND (served)", rep.Statuses[0], rep.Messages[0])
	}
}

// TestPodBoundOnRequestsInFlight: two containers of one pod have the pod's 3 requests in
// flight, each within its own bound of 2; a request of a third container of that pod waits for
// one of them and is BUSY once the wait (LockTimeout) is over, a request of another pod is
// served meanwhile, and once the held requests finish the third container is served.
func TestPodBoundOnRequestsInFlight(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	kube := rt.NewCgroup(t, h)
	cs := newContainers()
	cs.set(podB, "x", registry.Container{}, true)       // synced; requests naming pod A find nothing
	const held = "6b1a7c8d-9eaf-4b01-82d3-e4f5a6b7c8d9" // requests naming this pod are held
	release := make(chan struct{})
	entered := make(chan struct{}, 3)
	cs.hook = func(pod string) {
		if pod == held {
			entered <- struct{}{}
			<-release
		}
	}
	s := startServer(t, registry.Config{MaxRequestsPerCaller: 2, MaxRequestsPerPod: 3, LockTimeout: 100 * time.Millisecond},
		registry.Deps{Containers: cs, Cgroups: &h})
	var holders []*rt.Child
	for i, n := range []int{2, 1} {
		holders = append(holders, rt.StartChild(t, podCgroup(t, kube, podA, fmt.Sprint("held-", i)),
			rt.Spec{Socket: s.Socket(), Count: n, Once: true, Request: registry.Request{PodUID: held, ContainerName: "app"}}))
	}
	for range 3 {
		<-entered
	}
	req := registry.Request{PodUID: podA, ContainerName: "app"}
	third := podCgroup(t, kube, podA, "third")
	if rep := rt.StartChild(t, third, rt.Spec{Socket: s.Socket(), Count: 1, Once: true, Request: req}).Report(t); rep.Statuses[0] != "BUSY" ||
		!strings.Contains(rep.Messages[0], "this pod") {
		t.Errorf("third container of the pod while the pod's 3 are in flight: %s %q; want BUSY naming the pod", rep.Statuses[0], rep.Messages[0])
	}
	other := rt.StartChild(t, podCgroup(t, kube, podB, "app"), rt.Spec{Socket: s.Socket(), Count: 1, Once: true, Request: req})
	if rep := other.Report(t); rep.Statuses[0] != "NOT_FOUND" {
		t.Errorf("container of another pod: %s %s; want NOT_FOUND (served)", rep.Statuses[0], rep.Messages[0])
	}
	close(release)
	for _, ch := range holders {
		for i, st := range ch.Report(t).Statuses {
			if st != "NOT_FOUND" {
				t.Errorf("held request %d: %s", i, st)
			}
		}
	}
	if rep := rt.StartChild(t, third, rt.Spec{Socket: s.Socket(), Count: 1, Once: true, Request: req}).Report(t); rep.Statuses[0] != "NOT_FOUND" {
		t.Errorf("third container of the pod after the held requests: %s %s; want NOT_FOUND (served)", rep.Statuses[0], rep.Messages[0])
	}
}

// TestNewcomerShedsNewestStalledConnectionOfHeaviestPod: the node's 8 open connections are
// stalled ones, 5 of this test process (outside pods: a pod of its own) and 3 of a container
// of pod B. The test process's newcomer is refused BUSY: its pod holds the most. A container
// of a third pod is served: the newest stalled connection of the test process is answered BUSY
// in its place, and counted. Once pod B holds as many as the test process, its newcomer is
// refused too, and a third pod's sheds the newest of the two pods' connections.
func TestNewcomerShedsNewestStalledConnectionOfHeaviestPod(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	kube := rt.NewCgroup(t, h)
	cs := newContainers()
	cs.set(podB, "x", registry.Container{}, true) // synced; requests naming pod A find nothing
	reg := basemetrics.NewKubeRegistry()
	s := startServer(t, registry.Config{MaxOpenConns: 8, HeaderTimeout: time.Minute},
		registry.Deps{Containers: cs, Cgroups: &h, Metrics: vgpumetrics.NewRegistryMetrics(reg)})
	reading := func(n int) {
		t.Helper()
		waitFor(t, fmt.Sprintf("%d stalled connections to be read", n), func() bool { return registry.Reading(s) == n })
	}
	own := rt.Flood(t, s.Socket(), 5)
	reading(5)
	rt.StartChild(t, podCgroup(t, kube, podB, "stall-0"), rt.Spec{Socket: s.Socket(), Stall: 3}).Ready(t)
	reading(8)

	req := registry.Request{PodUID: podA, ContainerName: "app"}
	register := func(cg rt.Cgroup) (string, string) {
		rep := rt.StartChild(t, cg, rt.Spec{Socket: s.Socket(), Count: 1, Once: true, Request: req}).Report(t)
		return rep.Statuses[0], rep.Messages[0]
	}
	if resp := registerOnce(t, s.Socket(), req); resp.Status != registry.StatusBusy || !resp.HasRetryAfter {
		t.Errorf("newcomer of the pod holding the most: %+v; want BUSY with retry_after_ms", resp)
	}
	third := podCgroup(t, kube, uuidR, "new")
	for i := range 2 {
		if st, msg := register(third); st != "NOT_FOUND" {
			t.Fatalf("newcomer %d of a third pod over the node's bound: %s %s; want NOT_FOUND (served)", i, st, msg)
		}
		if resp, ok := answerOf(t, own[len(own)-1]); !ok || resp.Status != registry.StatusBusy || !resp.HasRetryAfter {
			t.Errorf("newest stalled connection of the test process after newcomer %d: %+v (answered %v); want BUSY with retry_after_ms", i, resp, ok)
		}
		reading(7)
		own = append(own[:len(own)-1], rt.Flood(t, s.Socket(), 1)...) // the test process holds 5 again
		reading(8)
	}

	// The test process 4, pod B 4.
	_ = own[len(own)-1].Close()
	reading(7)
	rt.StartChild(t, podCgroup(t, kube, podB, "stall-1"), rt.Spec{Socket: s.Socket(), Stall: 1}).Ready(t)
	reading(8)
	if st, msg := register(podCgroup(t, kube, podB, "new")); st != "BUSY" {
		t.Errorf("newcomer of pod B holding as many as the test process: %s %s; want BUSY", st, msg)
	}
	if st, msg := register(third); st != "NOT_FOUND" {
		t.Errorf("newcomer of a third pod with the two pods at 4 each: %s %s; want NOT_FOUND (served)", st, msg)
	}
	reading(7) // pod B's newest shed: the test process's connections are all still open
	if n := shedCount(t, reg); n != 3 {
		t.Errorf("registry_shed_connections_total = %v, want 3", n)
	}
	for i, c := range own[:4] {
		if resp, ok := answerWithin(c, 10*time.Millisecond); ok {
			t.Errorf("stalled connection %d of the test process was answered: %+v", i, resp)
		}
	}
}

// answerOf reads the response the server wrote to c before closing it.
func answerOf(t testing.TB, c net.Conn) (registry.Response, bool) {
	t.Helper()
	return answerWithin(c, 20*time.Second)
}

// answerWithin reads what the server writes to c within d; ok=false when nothing came.
func answerWithin(c net.Conn, d time.Duration) (registry.Response, bool) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	all, _ := io.ReadAll(c)
	if len(all) == 0 {
		return registry.Response{}, false
	}
	_, v, err := registry.ParseFrame(all)
	if err != nil {
		return registry.Response{Message: fmt.Sprintf("undecodable answer %x: %v", all, err)}, true
	}
	return v.(registry.Response), true
}

// shedCount reads registry_shed_connections_total.
func shedCount(t testing.TB, reg basemetrics.KubeRegistry) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "vgpu_dra_registry_shed_connections_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
