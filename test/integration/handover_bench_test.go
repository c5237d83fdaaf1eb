package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
)

// histogramSum is a histogram's sum of one instance.
func histogramSum(b testing.TB, p *plugin.Plugin, name string) float64 {
	b.Helper()
	families, err := p.Metrics().Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				return m.GetHistogram().GetSampleSum()
			}
		}
	}
	return 0
}

// BenchmarkHandoverPause measures the handover's pause (contract §14: how long the outgoing owner
// holds new kubelet calls and CreateContainers, vgpu_dra_handover_pause_seconds as the incoming
// instance records it) on a node with 20 prepared claims and 20 vGPU containers, and, as the
// in-run baseline, the gap of a restart without a handover: from the owner's Stop (NRI drain,
// everything stopped) until a new instance owns the node (GPU inventory, checkpoint, recovery,
// NRI, registry, kubelet services) — what maxSurge 0 costs before counting the pod's own start.
func BenchmarkHandoverPause(b *testing.B) {
	n := newNode(b)
	pod := func(i int) string { return fmt.Sprintf("0d0d0d0d-0000-4000-8000-%012d", i) }
	cur := n.startInstance(pod(0))
	for cur.NRI() == nil || !cur.NRI().Synced() {
		time.Sleep(10 * time.Millisecond)
	}
	k := n.registerPod(pod(0))
	ctx := context.Background()
	for i := range 20 {
		c := n.newClaim(fmt.Sprintf("bench-%d", i), allocated{request: "gpu", device: fmt.Sprintf("gpu-%d", i%2), memory: "256Mi", cores: 1,
			shareID: fmt.Sprintf("5a4e%04d-0000-4000-8000-000000000000", i)})
		resp := k.prepare(b, c)[string(c.UID)]
		p := podOf(c)
		if err := n.nri.runPod(ctx, p); err != nil {
			b.Fatal(err)
		}
		if _, err := n.nri.create(ctx, p.Id, n.vgpuContainer(fmt.Sprintf("bench-ctr-%d", i), "app", resp, string(c.UID))); err != nil {
			b.Fatal(err)
		}
	}
	next := 1
	var pauses []time.Duration
	b.ResetTimer()
	for range b.N {
		succ := n.startInstance(pod(next))
		next++
		// The successor records the pause once the old owner reported it, just after it owns.
		for instanceMetric(b, succ, "vgpu_dra_handover_pause_seconds") == 0 {
			time.Sleep(time.Millisecond)
		}
		pauses = append(pauses, time.Duration(histogramSum(b, succ, "vgpu_dra_handover_pause_seconds")*float64(time.Second)))
		cur.Stop()
		cur = succ
	}
	b.StopTimer()
	const restarts = 5
	var gaps []time.Duration
	for range restarts {
		start := time.Now()
		cur.Stop()
		cur = n.startInstance(pod(next))
		next++
		gaps = append(gaps, time.Since(start))
	}
	slices.Sort(pauses)
	slices.Sort(gaps)
	b.ReportMetric(float64(pauses[len(pauses)/2].Microseconds())/1000, "pause-p50-ms")
	b.ReportMetric(float64(pauses[len(pauses)-1].Microseconds())/1000, "pause-max-ms")
	b.ReportMetric(float64(gaps[len(gaps)/2].Microseconds())/1000, "restart-gap-p50-ms")
	b.ReportMetric(float64(pauses[len(pauses)/2])/float64(gaps[len(gaps)/2]), "pause-x-restart")
}
