package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	kmetrics "k8s.io/component-base/metrics"

	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// floodVictims is how many other containers register while one floods.
const floodVictims = 8

// BenchmarkRegistrationUnderTenantFlood measures what one container's flood costs the others
// (issue 10, contract §5 "Bounds"). 8 containers, each a real process in its own cgroup,
// register one registration after the other over the real socket, all 8 at once: first alone
// (the baseline), then while a 9th container floods the registry from its cgroup with 1,000
// stalled connections (one byte of a header, then nothing) and 64 workers that register over
// and over, with the library's retry rules, while the container holds its own pids.config
// locked. In reopen=never the flooder opens its 1,000 connections once: the server answers
// those over the container's bound BUSY and closes them. In reopen=20ms it opens again, after
// the BUSY hint of 20 ms, every connection the server closes, keeping 1,000 up: tens of
// thousands of connections a second, a flood of connection rate rather than of stalled
// connections. It reports p50/p99 of the 8 containers' registrations in both runs and the
// ratio of the p99s, how long Stop takes with the flood still on, and what the flood costs:
// the flood's connections answered (or closed) per second, CPU of the server (this process,
// the 8 containers' registrations included) and of the flooder. Every
// registration of the 8 must be OK. Nothing is asserted about time.
func BenchmarkRegistrationUnderTenantFlood(b *testing.B) {
	for _, reopen := range []time.Duration{0, 20 * time.Millisecond} {
		name := "reopen=never"
		if reopen > 0 {
			name = "reopen=" + reopen.String()
		}
		b.Run(name, func(b *testing.B) { benchTenantFlood(b, reopen) })
	}
}

func benchTenantFlood(b *testing.B, reopen time.Duration) {
	h := rt.Hierarchies(b)[0]
	dir, err := os.MkdirTemp("/tmp", "vgr-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	layout := claimdir.Layout{StateDir: filepath.Join(dir, "state")}
	ctrs := &layoutContainers{layout: layout, synced: true, byKey: map[string]registry.Container{}}
	if err := layout.EnsureClaimDir(regClaim); err != nil { // as Prepare does
		b.Fatal(err)
	}
	podUID := func(i int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012x", i+1, i+1) }
	var cgroups []rt.Cgroup
	var lock string
	for i := range floodVictims + 1 { // the last one floods
		dirs, err := layout.EnsureContainerDirs(regClaim, podUID(i), "app")
		if err != nil {
			b.Fatal(err)
		}
		cg := rt.NewCgroup(b, h)
		ctrs.byKey[podUID(i)+"/app"] = registry.Container{ConfigDir: dirs.Config, Cgroup: cg.Path}
		cgroups = append(cgroups, cg)
		lock = filepath.Join(dirs.Config, contract.PIDsConfigName)
	}
	if err := os.WriteFile(lock, []byte("1\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	flooder, victims := cgroups[floodVictims], cgroups[:floodVictims]
	reg := kmetrics.NewKubeRegistry()
	s, err := registry.Start(context.Background(), registry.Config{Socket: layout.RegistrySocket()},
		registry.Deps{Containers: ctrs, Cgroups: &h, Metrics: metrics.NewRegistryMetrics(reg)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Stop)
	perVictim := max(b.N/floodVictims, 25)

	b.ResetTimer()
	quiet := victimLatencies(b, s.Socket(), victims, podUID, perVictim)
	flood := rt.StartChild(b, flooder, rt.Spec{Socket: s.Socket(), Stall: 1000, StallReopen: reopen,
		Lock: lock, Repeat: true, Workers: 64, Request: registry.Request{PodUID: podUID(floodVictims), ContainerName: "app"}})
	flood.Ready(b)
	time.Sleep(200 * time.Millisecond) // the flood's registrations in flight and bouncing
	answered0, t0, cpu0, floodCPU0 := answeredTotal(b, reg), time.Now(), selfCPU(), procCPU(flood.PID)
	flooded := victimLatencies(b, s.Socket(), victims, podUID, perVictim)
	window := time.Since(t0).Seconds()
	victimAnswers := float64(floodVictims * (warmUp + perVictim))
	rate := (answeredTotal(b, reg) - answered0 - victimAnswers) / window // the flood's own
	serverCores, flooderCores := (selfCPU()-cpu0).Seconds()/window, (procCPU(flood.PID)-floodCPU0).Seconds()/window
	t1 := time.Now()
	s.Stop()
	stop := time.Since(t1)
	b.StopTimer()
	flood.Stop()

	qp50, qp99 := pct(quiet, 0.50), pct(quiet, 0.99)
	fp50, fp99 := pct(flooded, 0.50), pct(flooded, 0.99)
	b.ReportMetric(float64(qp50)/1e3, "quiet-p50-µs")
	b.ReportMetric(float64(qp99)/1e3, "quiet-p99-µs")
	b.ReportMetric(float64(fp50)/1e3, "flood-p50-µs")
	b.ReportMetric(float64(fp99)/1e3, "flood-p99-µs")
	if qp99 > 0 {
		b.ReportMetric(float64(fp99)/float64(qp99), "p99-flood/quiet")
	}
	b.ReportMetric(float64(stop)/1e6, "stop-under-flood-ms")
	b.ReportMetric(rate, "flood-answers/s")
	b.ReportMetric(serverCores, "server-cores")
	b.ReportMetric(flooderCores, "flooder-cores")
}

// warmUp registrations of each victim process are made but not counted: they overlap the
// start-up of the other victims' processes.
const warmUp = 5

// victimLatencies has every victim register n times, one after the other, all victims at
// once, and returns the latencies, sorted; it fails unless every answer is OK.
func victimLatencies(b *testing.B, sock string, victims []rt.Cgroup, podUID func(int) string, n int) []int64 {
	children := make([]*rt.Child, len(victims))
	for i, cg := range victims {
		children[i] = rt.StartChild(b, cg, rt.Spec{Socket: sock, Count: warmUp + n, Workers: 1,
			Request: registry.Request{PodUID: podUID(i), ContainerName: "app"}})
	}
	var all []int64
	for i, ch := range children {
		rep := ch.Report(b)
		ch.Stop()
		for j, st := range rep.Statuses {
			if st != "OK" {
				b.Fatalf("container %d, registration %d: %s %s", i, j, st, rep.Messages[j])
			}
		}
		all = append(all, rep.Latencies[warmUp:]...)
	}
	slices.Sort(all)
	return all
}

// answeredTotal is the number of connections the server has answered or closed, all statuses.
func answeredTotal(b *testing.B, reg kmetrics.KubeRegistry) float64 {
	fams, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	n := 0.0
	for _, f := range fams {
		if f.GetName() == "vgpu_dra_registry_requests_total" {
			for _, m := range f.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// selfCPU is the CPU time of this process (the server and the benchmark's own goroutines).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is the CPU time of process pid so far (utime + stime of /proc/<pid>/stat).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}
