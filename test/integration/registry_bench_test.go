package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	kmetrics "k8s.io/component-base/metrics"

	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// BenchmarkRegistration measures registrations over the real socket, from a real process
// in a real container cgroup, each one peer-checked and writing pids.config, at 1, 8 and 64
// concurrent clients. It reports p50/p99 latency and registrations per second, and the p50
// of a bare unix-socket round trip (connect, 12-byte request, 12-byte answer, close) at the
// same concurrency as the baseline. Every registration must be answered OK (none lost).
func BenchmarkRegistration(b *testing.B) {
	for _, clients := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			benchRegistrations(b, clients, 0)
		})
	}
}

// BenchmarkRegistrationDuringStallFlood: one client registers while 1,000 connections that
// sent one byte stall (contract §5: a flood must not delay a well-formed registration by
// more than a few milliseconds).
func BenchmarkRegistrationDuringStallFlood(b *testing.B) {
	benchRegistrations(b, 1, 1000)
}

func benchRegistrations(b *testing.B, clients, stalled int) {
	h := rt.Hierarchies(b)[0]
	dir, err := os.MkdirTemp("/tmp", "vgr-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	layout := claimdir.Layout{StateDir: filepath.Join(dir, "state")}
	if err := layout.EnsureClaimDir(regClaim); err != nil { // as Prepare does
		b.Fatal(err)
	}
	dirs, err := layout.EnsureContainerDirs(regClaim, regPodA, "app")
	if err != nil {
		b.Fatal(err)
	}
	ctr := rt.NewCgroup(b, h)
	ctrs := &layoutContainers{layout: layout, synced: true, byKey: map[string]registry.Container{
		regPodA + "/app": {ConfigDir: dirs.Config, Cgroup: ctr.Path},
	}}
	reg := kmetrics.NewKubeRegistry()
	m := metrics.NewRegistryMetrics(reg)
	s, err := registry.Start(context.Background(), registry.Config{Socket: layout.RegistrySocket()},
		registry.Deps{Containers: ctrs, Cgroups: &h, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Stop)
	if stalled > 0 {
		rt.Flood(b, s.Socket(), stalled)
	}
	baseline, baseline99 := baselineRoundTrip(b, dir, clients, max(b.N, 200))

	b.ResetTimer()
	ch := rt.StartChild(b, ctr, rt.Spec{Socket: s.Socket(), Count: b.N, Workers: clients,
		Request: registry.Request{PodUID: regPodA, ContainerName: "app"}})
	rep := ch.Report(b)
	b.StopTimer()
	for i, st := range rep.Statuses {
		if st != "OK" {
			b.Fatalf("registration %d of %d: %s %s", i, b.N, st, rep.Messages[i])
		}
	}
	lat := slices.Clone(rep.Latencies)
	slices.Sort(lat)
	p50, p99 := pct(lat, 0.50), pct(lat, 0.99)
	b.ReportMetric(float64(p50)/1e3, "p50-µs")
	b.ReportMetric(float64(p99)/1e3, "p99-µs")
	b.ReportMetric(float64(len(lat))/time.Duration(rep.WallNS).Seconds(), "regs/s")
	b.ReportMetric(float64(baseline)/1e3, "baseline-p50-µs")
	b.ReportMetric(float64(baseline99)/1e3, "baseline-p99-µs")
	b.ReportMetric(serverMeanMicros(b, reg), "server-mean-µs")
	if baseline > 0 {
		b.ReportMetric(float64(p50)/float64(baseline), "p50/baseline")
	}
}

func pct(sorted []int64, q float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// baselineRoundTrip is the p50 and p99 of n bare round trips over a unix socket at the given
// concurrency, from this process: what any one-request-per-connection protocol costs on this
// machine.
func baselineRoundTrip(b *testing.B, dir string, clients, n int) (p50, p99 int64) {
	sock := filepath.Join(dir, "baseline.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var buf [12]byte
				if _, err := io.ReadFull(c, buf[:]); err == nil {
					_, _ = c.Write(buf[:])
				}
			}()
		}
	}()
	lat := make([]int64, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			var buf [12]byte
			for i := range next {
				t0 := time.Now()
				c, err := net.Dial("unix", sock)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = c.Write(buf[:])
				_, _ = io.ReadFull(c, buf[:])
				_ = c.Close()
				lat[i] = int64(time.Since(t0))
			}
		})
	}
	wg.Wait()
	slices.Sort(lat)
	return pct(lat, 0.5), pct(lat, 0.99)
}

// serverMeanMicros is the mean of registry_request_duration_seconds (accept to response
// written): the server's share of a registration's latency.
func serverMeanMicros(b *testing.B, reg kmetrics.KubeRegistry) float64 {
	fams, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "vgpu_dra_registry_request_duration_seconds" {
			for _, m := range f.GetMetric() {
				if h := m.GetHistogram(); h.GetSampleCount() > 0 {
					return h.GetSampleSum() / float64(h.GetSampleCount()) * 1e6
				}
			}
		}
	}
	return 0
}
