package usage_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2/ktesting"

	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	vgpumetrics "github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage/usagetest"
)

// newBenchNode is a node of 8 simulated H200s with n containers on the NRI path, spread over
// the GPUs, each with its real vgpu.config, pids.config (two processes), a ledger with one
// live process and an allowance of the arbiter, sampled once.
func newBenchNode(b *testing.B, n int) *node {
	nd := newNode(b, 8, usage.Config{}, nil)
	for i := range n {
		g := nd.uuids[i%len(nd.uuids)]
		key := fmt.Sprintf("ctr-%03d", i)
		nd.allowances[[2]string{key, g}] = 10
		nd.target(usage.Target{Namespace: "bench", Pod: fmt.Sprintf("pod-%03d", i), Container: "app", Claim: fmt.Sprintf("claim-%03d", i),
			Key: key, Compute: map[string]usage.ComputeTerms{g: {Class: "Guaranteed", Ceiling: 10}}},
			config(podA, "app", "gpu 0 "+g+" 1073741824 10"), []int{1000 + 2*i, 1001 + 2*i},
			&usagetest.Ledger{Refused: uint64(i % 3), Slots: []usagetest.Slot{usagetest.Live(map[int]uint64{0: 512 << 20})}})
	}
	_, ctx := ktesting.NewTestContext(b)
	nd.sampler.Sample(ctx)
	return nd
}

// pluginRegistry is the plugin's own registry with every metric it registers besides the usage
// collector: the baseline a scrape costs today.
func pluginRegistry() metrics.KubeRegistry {
	reg := component.NewMetricsRegistry()
	vgpumetrics.New(reg)
	vgpumetrics.NewNRIMetrics(reg)
	vgpumetrics.NewRegistryMetrics(reg)
	return reg
}

// scrape serves /metrics once and returns the bytes written.
func scrape(b *testing.B, h http.Handler) int {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		b.Fatalf("scrape: status %d", rec.Code)
	}
	return rec.Body.Len()
}

// BenchmarkScrape measures one /metrics scrape of the plugin with 100 containers sharing its
// GPUs (the per-container series served from the sampler's snapshot), against the same scrape
// without the usage collector in the same run (the baseline: operation, Go runtime and process
// metrics). It reports time and allocations per scrape for both, and what the usage metrics add.
//
//	go test -run '^$' -bench BenchmarkScrape -benchmem ./pkg/usage/
func BenchmarkScrape(b *testing.B) {
	for _, containers := range []int{100} {
		b.Run(fmt.Sprintf("containers=%d", containers), func(b *testing.B) {
			n := newBenchNode(b, containers)
			base := component.MetricsHandler(pluginRegistry())
			withUsage := pluginRegistry()
			collector := usage.NewCollector(n.sampler.Snapshot)
			withUsage.CustomMustRegister(collector)
			collector.Prepare(n.sampler.Snapshot()) // as the sampler does after each sample
			ours := component.MetricsHandler(withUsage)
			baseNs, baseAllocs, baseBytes := measure(b, base, 200)
			bytes := scrape(b, ours)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				scrape(b, ours)
			}
			b.StopTimer()
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			_, allocs, _ := measure(b, ours, 50)
			b.ReportMetric(ns, "scrape-ns")
			b.ReportMetric(allocs, "scrape-allocs")
			b.ReportMetric(baseNs, "baseline-scrape-ns")
			b.ReportMetric(baseAllocs, "baseline-scrape-allocs")
			b.ReportMetric(ns/baseNs, "x-baseline")
			b.ReportMetric((ns-baseNs)/float64(containers), "added-ns/container")
			b.ReportMetric((allocs-baseAllocs)/float64(containers), "added-allocs/container")
			b.ReportMetric(float64(bytes-baseBytes)/float64(containers), "added-bytes/container")
		})
	}
}

// BenchmarkSample measures one background sample of the node (every file of every container
// read, NVML asked once per GPU), against a sample of the same node with no container in the
// same run. It runs every DefaultInterval, off any request's path.
func BenchmarkSample(b *testing.B) {
	n := newBenchNode(b, 100)
	empty := newBenchNode(b, 0)
	_, ctx := ktesting.NewTestContext(b)
	const baseRounds = 200
	start := time.Now()
	for range baseRounds {
		empty.sampler.Sample(ctx)
	}
	baseNs := float64(time.Since(start).Nanoseconds()) / baseRounds
	b.ReportAllocs()
	for b.Loop() {
		n.sampler.Sample(ctx)
	}
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(baseNs, "baseline-sample-ns")
	b.ReportMetric((ns-baseNs)/100, "ns/container")
	if got := len(n.sampler.Snapshot().Containers); got != 100 {
		b.Fatalf("the snapshot holds %d containers, want 100", got)
	}
}

// measure runs h rounds times and returns the mean time, allocations and bytes of a scrape.
func measure(b *testing.B, h http.Handler, rounds int) (ns, allocs float64, bytes int) {
	b.Helper()
	scrape(b, h) // warm
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	for range rounds {
		bytes = scrape(b, h)
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	return float64(elapsed.Nanoseconds()) / float64(rounds), float64(after.Mallocs-before.Mallocs) / float64(rounds), bytes
}
