package registry_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// Many containers flooding at once, each within its own bounds, must not fill the node's
// (contract §5, "Bounds"): 66 containers at 64 stalled connections and 16 registrations each
// are more than the node-wide 4,096 connections and 1,024 requests.

const (
	floodContainers    = 66
	floodStalledPerCtr = 64 // a container's bound on connections reading their frame
	floodRequestsPerCt = 16 // a container's bound on requests in flight
	victimAttempts     = 20
	// floodHold is the server's header and lock deadline under a flood: longer than any run,
	// so that the whole flood stays at the server without reconnecting.
	floodHold = 10 * time.Minute
)

// floodPod is the UID of the i-th flooding pod.
func floodPod(i int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012x", i+1, i+1) }

// nodeFlood is a flood of floodContainers containers, each at its own bounds, held up at the
// server, and the cgroup of a container outside it whose registrations are resolved.
type nodeFlood struct {
	name   string
	s      *registry.Server
	victim rt.Cgroup
}

// victimRequest is what the container outside the flood registers.
var victimRequest = registry.Request{PodUID: podB, ContainerName: "app"}

// floodLayouts are the two ways the flooding containers are placed: all in one pod, or each
// in a pod of its own.
var floodLayouts = []bool{true, false}

func floodName(onePod bool) string {
	if onePod {
		return fmt.Sprintf("one pod of %d containers", floodContainers)
	}
	return fmt.Sprintf("%d pods", floodContainers)
}

// startNodeFlood floods a new server from floodContainers containers — all in one pod
// (onePod), or each in a pod of its own — each at its own bounds: 16 registrations for a claim
// whose pids.config they all hold LOCK_SH on, so that each waits for the lock, then 64
// connections that send one byte and stall. The server's header and lock deadlines are
// floodHold, so that the whole flood stays at the server without reconnecting; it returns once
// every connection of it has been accepted. quiet, when not nil, runs before the flood starts.
func startNodeFlood(tb testing.TB, h registry.CgroupHierarchy, onePod bool, quiet func(nodeFlood)) nodeFlood {
	tb.Helper()
	f := nodeFlood{name: floodName(onePod)}
	kube := rt.NewCgroup(tb, h)
	claimDir := configDir(tb, shortDir(tb), "claim")
	lock := pidsFile(tb, claimDir)
	f.victim = kube.Sub(tb, "kubepods/besteffort/pod"+podB+"/victim")
	var pods []string
	var flooders []rt.Cgroup
	for i := range floodContainers {
		pod := podA
		if !onePod {
			pod = floodPod(i)
		}
		if !slices.Contains(pods, pod) {
			pods = append(pods, pod)
		}
		flooders = append(flooders, kube.Sub(tb, fmt.Sprintf("kubepods/besteffort/pod%s/ctr-%d", pod, i)))
	}
	cs := newContainers()
	cs.set(podB, "app", registry.Container{ConfigDir: configDir(tb, shortDir(tb), "victim"), Cgroup: f.victim.Path}, true)
	f.s = startServer(tb, registry.Config{HeaderTimeout: floodHold, LockTimeout: floodHold}, registry.Deps{
		Containers: cs, Claims: claims{uuidR: {UID: claim, ReservedFor: pods, ConfigDir: claimDir}}, Cgroups: &h,
	})
	if quiet != nil {
		quiet(f)
	}
	// First the registrations, then the stalled connections: in this order every one of
	// them stays at the server (a stalled connection never holds the place of a registration).
	start := func(spec rt.Spec, accepted int) {
		var children []*rt.Child
		for _, cg := range flooders {
			children = append(children, rt.StartChild(tb, cg, spec))
		}
		for _, ch := range children {
			ch.Ready(tb)
		}
		waitFor(tb, "every connection of the flood to be accepted", func() bool {
			// Registrations are read at once: wait for them to be in flight or answered.
			return registry.Accepted(f.s) >= accepted && (spec.Stall > 0 || registry.Reading(f.s) == 0)
		})
	}
	start(rt.Spec{Socket: f.s.Socket(), Lock: lock, Count: floodRequestsPerCt, Once: true,
		Request: registry.Request{RegisterUUID: uuidR}}, floodContainers*floodRequestsPerCt)
	start(rt.Spec{Socket: f.s.Socket(), Stall: floodStalledPerCtr}, floodContainers*(floodRequestsPerCt+floodStalledPerCtr))
	return f
}

// TestManyContainersFloodingDoNotLockOthersOut: 66 containers flood the registry, each at its
// own bounds (startNodeFlood), all in one pod or each in a pod of its own. A container outside
// the flood registers 20 times, one attempt each: every attempt is answered OK, none BUSY. The
// attempts' latencies are logged, not asserted.
func TestManyContainersFloodingDoNotLockOthersOut(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	for _, onePod := range floodLayouts {
		t.Run(floodName(onePod), func(t *testing.T) {
			f := startNodeFlood(t, h, onePod, nil)
			victim := rt.StartChild(t, f.victim, rt.Spec{Socket: f.s.Socket(), Count: victimAttempts, Workers: 1, Once: true, Request: victimRequest})
			rep := victim.Report(t)
			busy := 0
			for i, st := range rep.Statuses {
				if st == "BUSY" {
					busy++
				}
				if st != "OK" {
					t.Errorf("attempt %d of the container outside the flood: %s %s; want OK", i, st, rep.Messages[i])
				}
			}
			p50, slowest := medianAndSlowest(rep.Latencies)
			t.Logf("container outside a flood of %s, one attempt each: %d of %d BUSY; latency median %v, slowest %v",
				f.name, busy, victimAttempts, p50, slowest)
			stopWithin(t, f.s)
		})
	}
}

// BenchmarkRegistrationUnderNodeFlood measures what a flood of 66 containers at their own
// bounds (startNodeFlood: all in one pod, or each in a pod of its own; 4,224 stalled
// connections and 1,056 registrations waiting for a lock) costs a container outside it: it
// registers max(b.N, 20) times, one after the other, with the library's retry rules (BUSY and
// RETRY retried; a budget of 5 s, not the contract's 30 s, so that a registration the flood
// keeps out ends), first before the flood starts (the baseline), then under it. It reports the
// median and slowest registration, retries included, of both, and how many registrations under
// the flood did not end OK. Nothing is asserted about time; a registration that does not end OK
// fails the benchmark.
func BenchmarkRegistrationUnderNodeFlood(b *testing.B) {
	h := rt.Hierarchies(b)[0]
	for _, onePod := range floodLayouts {
		name := "66-pods"
		if onePod {
			name = "one-pod"
		}
		b.Run(name, func(b *testing.B) {
			n := max(b.N, victimAttempts)
			register := func(f nodeFlood) rt.Report {
				return rt.StartChild(b, f.victim, rt.Spec{Socket: f.s.Socket(), Count: n, Workers: 1, Budget: 5 * time.Second,
					Request: victimRequest}).Report(b)
			}
			var quiet rt.Report
			f := startNodeFlood(b, h, onePod, func(f nodeFlood) { quiet = register(f) })
			b.ResetTimer()
			rep := register(f)
			b.StopTimer()
			failed := 0
			for i, st := range rep.Statuses {
				if st != "OK" {
					failed++
					b.Logf("registration %d: %s %s", i, st, rep.Messages[i])
				}
			}
			q50, qSlowest := medianAndSlowest(quiet.Latencies)
			p50, slowest := medianAndSlowest(rep.Latencies)
			b.Logf("container outside a flood of %s, %d registrations with retries: median %v, slowest %v, %d not OK (before the flood: median %v, slowest %v)",
				f.name, n, p50, slowest, failed, q50, qSlowest)
			b.ReportMetric(float64(q50.Microseconds()), "quiet-median-µs")
			b.ReportMetric(float64(qSlowest.Microseconds()), "quiet-slowest-µs")
			b.ReportMetric(float64(p50.Microseconds()), "flood-median-µs")
			b.ReportMetric(float64(slowest.Microseconds()), "flood-slowest-µs")
			b.ReportMetric(float64(failed), "flood-not-ok")
			if failed > 0 {
				b.Errorf("%d of %d registrations of the container outside the flood did not end OK", failed, n)
			}
			stopWithin(b, f.s)
		})
	}
}

// medianAndSlowest of latencies in nanoseconds.
func medianAndSlowest(ns []int64) (time.Duration, time.Duration) {
	s := slices.Sorted(slices.Values(ns))
	return time.Duration(s[len(s)/2]), time.Duration(s[len(s)-1])
}
