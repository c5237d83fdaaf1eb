package arbiter

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// requests is an inference server's queue in the simulation: requests arrive at random
// (Poisson), each needs work GPU-seconds of the whole GPU, and are served in order by whatever
// utilisation the share gets; latency is completion less arrival.
type requests struct {
	arrivals []float64 // seconds
	work     float64   // GPU-seconds each
	next     int       // first arrival not yet queued
	queue    []float64 // arrival times of queued requests
	left     float64   // GPU-seconds left of the head of the queue
	latency  []float64
}

func poisson(seed uint64, rate, seconds, work float64) *requests {
	rng := rand.New(rand.NewPCG(seed, 26))
	r := &requests{work: work}
	for t := rng.ExpFloat64() / rate; t < seconds; t += rng.ExpFloat64() / rate {
		r.arrivals = append(r.arrivals, t)
	}
	return r
}

// want is what the share would keep busy at t: everything while a request waits.
func (r *requests) want(t float64) float64 {
	for r.next < len(r.arrivals) && r.arrivals[r.next] <= t {
		if len(r.queue) == 0 {
			r.left = r.work
		}
		r.queue = append(r.queue, r.arrivals[r.next])
		r.next++
	}
	if len(r.queue) > 0 {
		return 100
	}
	return 0
}

// serve spends util percent of the GPU for one step ending at end.
func (r *requests) serve(util, end float64) {
	done := util / 100 * simStep
	for done > 0 && len(r.queue) > 0 {
		use := min(done, r.left)
		r.left -= use
		done -= use
		if r.left <= 1e-12 {
			r.latency = append(r.latency, end-r.queue[0])
			r.queue = r.queue[1:]
			r.left = r.work
		}
	}
}

func p99(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[int(0.99*float64(len(s)-1))]
}

// latencyWorkloads are the guaranteed share's requests: Poisson arrivals of fixed work (GPU-
// seconds of the whole GPU), for its request of 60: requests of 100 ms twice a second (an
// inference server's batches), and of 20 ms twelve times a second (single small requests).
var latencyWorkloads = []struct {
	name       string
	rate, work float64
}{
	{"requests-100ms", 2, 0.06},
	{"requests-20ms", 12, 0.012},
}

// latencyRun runs a guaranteed share of 60 serving the workload for 60 s, beside a best-effort
// share of 10 that would take the whole GPU when withBE, with or without the wake path.
func latencyRun(rate, work float64, withBE, wake bool) (*requests, *sim) {
	q := poisson(11, rate, 60, work)
	g := share(Guaranteed, 60, 60, q.want)
	g.serve = q.serve
	shares := []*simShare{g}
	if withBE {
		shares = append(shares, share(BestEffort, 10, 100, always(100)))
	}
	s := newSim(shares...)
	s.wake = wake
	s.run(60)
	return q, s
}

// latencyFigures are the guaranteed share's p99 alone and shared, and the part of the idle time
// it leaves that the best-effort share gets, percent.
func latencyFigures(rate, work float64, wake bool) (alone, shared, beIdle float64) {
	a, aloneSim := latencyRun(rate, work, false, wake)
	sh, s := latencyRun(rate, work, true, wake)
	idle := 100 - aloneSim.mean(0, 1, 60)
	return p99(a.latency), p99(sh.latency), 100 * s.mean(1, 1, 60) / idle
}

// TestGuaranteedLatencyBesideBestEffort: issue 26's latency target, with the wake path. A
// guaranteed share serving requests of 100 ms that arrive at random keeps its request latency
// p99 within +10 % of running alone while a best-effort share saturates the GPU, and the
// best-effort share still gets ≥ 80 % of the time the guaranteed one leaves idle. Without the
// wake path the best-effort share keeps the guaranteed one's time for up to two passes after
// each request arrives (BenchmarkGuaranteedLatency/requests-100ms/pass-only: +14 %).
func TestGuaranteedLatencyBesideBestEffort(t *testing.T) {
	w := latencyWorkloads[0]
	alone, shared, be := latencyFigures(w.rate, w.work, true)
	t.Logf("p99 %.1f ms alone, %.1f ms beside best-effort (%+.1f %%); best-effort %.0f %% of the idle time",
		alone*1000, shared*1000, 100*(shared/alone-1), be)
	if shared > 1.1*alone {
		t.Errorf("guaranteed p99 latency %.1f ms beside best-effort, %.1f ms alone: more than +10 %%", shared*1000, alone*1000)
	}
	if be < 80 {
		t.Errorf("the best-effort share got %.0f %% of the idle time, want ≥ 80 %%", be)
	}
}

// BenchmarkGuaranteedLatency reports, for each workload, with the wake path and without it
// (pass-only), the guaranteed share's request latency p99 alone and beside the best-effort
// share, their ratio (target ≤ 1.10), and the best-effort share's part of the idle time (target
// ≥ 80 %). The figures are simulated time, the same every run; ns/op is only the simulation's
// cost.
func BenchmarkGuaranteedLatency(b *testing.B) {
	for _, w := range latencyWorkloads {
		for _, wake := range []bool{false, true} {
			name := w.name + "/pass-only"
			if wake {
				name = w.name + "/wake"
			}
			b.Run(name, func(b *testing.B) {
				var alone, shared, be float64
				for b.Loop() {
					alone, shared, be = latencyFigures(w.rate, w.work, wake)
				}
				b.ReportMetric(alone*1000, "p99-alone-ms")
				b.ReportMetric(shared*1000, "p99-shared-ms")
				b.ReportMetric(shared/alone, "p99-x")
				b.ReportMetric(be, "be-idle-%")
			})
		}
	}
}
