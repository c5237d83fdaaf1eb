//go:build benchcompare

package benchcompare

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// measure is one row of the comparison: a figure each driver's round yields.
type measure struct {
	key, what, unit string
	of              func(round) float64
}

var measures = []measure{
	{"prepare-p50", "Prepare, one claim per call, p50", "ms", func(r round) float64 { return pctMs(r.prepare, 0.50) }},
	{"prepare-p99", "Prepare, one claim per call, p99", "ms", func(r round) float64 { return pctMs(r.prepare, 0.99) }},
	{"unprepare-p50", "Unprepare, one claim per call, p50", "ms", func(r round) float64 { return pctMs(r.unprepare, 0.50) }},
	{"unprepare-p99", "Unprepare, one claim per call, p99", "ms", func(r round) float64 { return pctMs(r.unprepare, 0.99) }},
	{"burst-prepare", fmt.Sprintf("%d claims in one call: prepare", burst), "ms", func(r round) float64 { return ms(r.burstPrepare) }},
	{"burst-unprepare", fmt.Sprintf("%d claims in one call: unprepare", burst), "ms", func(r round) float64 { return ms(r.burstUnprepare) }},
	{"workers-prepare", fmt.Sprintf("%d calls from %d workers: prepare wall", burst, burstWorkers), "ms", func(r round) float64 { return ms(r.workerPrepare) }},
	{"workers-unprepare", fmt.Sprintf("%d calls from %d workers: unprepare wall", burst, burstWorkers), "ms", func(r round) float64 { return ms(r.workerUnprepare) }},
	{"cpu-cycle", "CPU per Prepare + Unprepare", "ms", func(r round) float64 { return r.cpuPerCycle * 1000 }},
	{"rss-idle", "RSS idle", "MiB", func(r round) float64 { return r.rssIdle }},
	{"rss-idle-anon", "RSS idle: anonymous (heap, stacks)", "MiB", func(r round) float64 { return r.anonIdle }},
	{"rss-idle-file", "RSS idle: file-backed (the executable)", "MiB", func(r round) float64 { return r.fileIdle }},
	{"rss-100", "RSS, 100 claims prepared", "MiB", func(r round) float64 { return r.rss100 }},
	{"rss-800", fmt.Sprintf("RSS, %d claims prepared", held), "MiB", func(r round) float64 { return r.rss800 }},
	{"rss-peak", "RSS peak (VmHWM)", "MiB", func(r round) float64 { return r.peak }},
	{"threads", fmt.Sprintf("OS threads after the %d-worker burst", burstWorkers), "", func(r round) float64 { return r.threads }},
	{"api-per-claim", "API requests per claim (Prepare + Unprepare)", "", func(r round) float64 { return r.apiPerClaim }},
}

// report prints the table (median and range over the rounds of each driver, and the ratio of
// the medians, ours over the test driver's) and reports each as a benchmark metric for the
// summary of make bench: <key>-ours, <key>-test and <key>-x.
func report(b *testing.B, rounds int, ours, test []round) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "vgpu-dra and the Kubernetes DRA test driver, %d rounds interleaved (median, range in brackets):\n", rounds)
	fmt.Fprintf(&sb, "%-50s %26s %26s %8s\n", "measure", "test driver", "vgpu-dra", "ratio")
	for _, m := range measures {
		o, t := values(ours, m.of), values(test, m.of)
		ratio := median(o) / median(t)
		fmt.Fprintf(&sb, "%-50s %26s %26s %7.2fx\n", m.what, spread(t, m.unit), spread(o, m.unit), ratio)
		b.ReportMetric(median(o), m.key+"-ours")
		b.ReportMetric(median(t), m.key+"-test")
		b.ReportMetric(ratio, m.key+"-x")
	}
	b.Log("\n" + sb.String())
}

func values(rounds []round, of func(round) float64) []float64 {
	out := make([]float64, len(rounds))
	for i, r := range rounds {
		out[i] = of(r)
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func spread(v []float64, unit string) string {
	return fmt.Sprintf("%.2f [%.2f–%.2f] %s", median(v), slices.Min(v), slices.Max(v), unit)
}

func pctMs(d []time.Duration, q float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return ms(s[min(len(s)-1, int(q*float64(len(s))))])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
