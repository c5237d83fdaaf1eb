package arbiter

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The closed loop the arbiter runs in, simulated in steps of 10 ms: a GPU time-sliced between
// the contexts that have work (each context with work gets an equal part of the time, up to what
// it wants; what one does not want goes to the others), each share's library holding it to the
// allowance it read at its last control tick (every 100 ms, at its own phase), and the arbiter
// dividing the GPU every pass from the utilisation NVML reports for the pass before.

const (
	simStep    = 0.001 // seconds
	simPass    = 0.1   // the arbiter's pass (the enforcer's --core-period)
	simControl = 0.1   // the library's control period
	// The wake path's library side (contract §16): a wake after 20 ms without launches, the
	// allowance followed every 5 ms.
	simWakeIdle = 0.02
	simFollow   = 0.005
)

type simShare struct {
	Share
	demand func(t float64) float64 // what it would keep busy unconstrained, percent
	phase  float64                 // of its library's control tick, seconds
	cap    float64                 // the allowance its library holds it to
	busy   float64                 // accumulated over the current pass, percent·steps
	// serve, when set, is given the utilisation the share got in each step and the step's end.
	serve func(util, end float64)
	// lastLaunch is when it last had work (the wake path), -1 never.
	lastLaunch float64
	trace      []float64 // its utilisation per step
}

type sim struct {
	shares []*simShare
	arb    *Arbiter
	steps  int
	allow  [][]float64 // per pass, per share
	// wake: the libraries signal wakes and follow their allowance every simFollow (the wake
	// path); else they read it at their control tick only.
	wake bool
	now  float64 // seconds
}

func newSim(shares ...*simShare) *sim {
	s := &sim{shares: shares, arb: New(nil)}
	s.arb.now = func() time.Time { return time.Unix(0, 0).Add(time.Duration(s.now * 1e9)) }
	s.arb.SetWakeHold(time.Duration(simPass*1e9), nil)
	for i, sh := range shares {
		sh.cap = sh.Request
		sh.phase = float64(i) * 0.037
		sh.Key = fmt.Sprintf("s%d", i)
		sh.lastLaunch = -1
	}
	return s
}

// ticks reports whether a period of the share's library, at its phase, ends at t.
func ticks(t, phase, period float64) bool {
	k := math.Mod(t-phase+10*period, period)
	return k < simStep/2 || period-k < simStep/2
}

// timeSlice divides 100 % between the wants, equal parts water-filled.
func timeSlice(want []float64) []float64 {
	out := make([]float64, len(want))
	left := 100.0
	idx := []int{}
	for i, w := range want {
		if w > 0 {
			idx = append(idx, i)
		}
	}
	slices.SortFunc(idx, func(a, b int) int { return int(math.Copysign(1, want[a]-want[b])) })
	for n, i := range idx {
		fair := left / float64(len(idx)-n)
		out[i] = min(want[i], fair)
		left -= out[i]
	}
	return out
}

func (s *sim) run(seconds float64) {
	perPass := int(math.Round(simPass / simStep))
	pending := make([]float64, len(s.shares))
	for i, sh := range s.shares {
		pending[i] = sh.cap
	}
	for n := int(math.Round(seconds / simStep)); n > 0; n-- {
		t := float64(s.steps) * simStep
		s.now = t
		want := make([]float64, len(s.shares))
		for i, sh := range s.shares {
			d := sh.demand(t)
			if s.wake && d > 0 {
				// A launch after an idle spell signals a wake; the node re-divides at once.
				if sh.lastLaunch < 0 || t-sh.lastLaunch >= simWakeIdle {
					if s.arb.Wake(sh.Key) == WakeTaken {
						s.arb.Redivide()
						for j, o := range s.shares {
							if a, ok := s.arb.Allowance(o.Key, "gpu"); ok {
								pending[j] = a
							}
						}
					}
				}
				sh.lastLaunch = t
			}
			// The library reads the allowance file at its control tick (the wake path: every
			// simFollow too).
			if ticks(t, sh.phase, simControl) || s.wake && ticks(t, sh.phase, simFollow) {
				sh.cap = pending[i]
			}
			want[i] = min(max(d, 0), sh.cap)
		}
		for i, u := range timeSlice(want) {
			s.shares[i].busy += u
			s.shares[i].trace = append(s.shares[i].trace, u)
			if s.shares[i].serve != nil {
				s.shares[i].serve(u, t+simStep)
			}
		}
		s.steps++
		if s.steps%perPass == 0 {
			in := make([]Input, len(s.shares))
			for i, sh := range s.shares {
				in[i] = Input{Share: sh.Share}
				in[i].Util = sh.busy / float64(perPass)
				sh.busy = 0
			}
			out := s.arb.Divide("gpu", in)
			s.arb.EndPass()
			copy(pending, out)
			s.allow = append(s.allow, out)
		}
	}
}

// mean is share i's utilisation averaged over [from, to) seconds.
func (s *sim) mean(i int, from, to float64) float64 {
	tr := s.shares[i].trace[int(from/simStep):int(to/simStep)]
	sum := 0.0
	for _, u := range tr {
		sum += u
	}
	return sum / float64(len(tr))
}

// settle is how long after at share i's utilisation, averaged over a sliding 100 ms, stays
// within tol of target.
func (s *sim) settle(i int, at, target, tol float64) float64 {
	tr := s.shares[i].trace
	win := int(simPass / simStep)
	last := int(at / simStep)
	for k := int(at/simStep) + win; k <= len(tr); k++ {
		m := 0.0
		for _, u := range tr[k-win : k] {
			m += u
		}
		if math.Abs(m/float64(win)-target) > tol {
			last = k
		}
	}
	return float64(last)*simStep - at
}

func always(p float64) func(float64) float64 { return func(float64) float64 { return p } }

func from(t0, p float64) func(float64) float64 {
	return func(t float64) float64 {
		if t >= t0 {
			return p
		}
		return 0
	}
}

func share(class Class, req, ceil float64, demand func(float64) float64) *simShare {
	return &simShare{Share: Share{Class: class, Request: req, Ceiling: ceil}, demand: demand}
}

// TestBurstReachesTheCeilingAndComesBack: issue 26's burst target. Alone, a share with request
// 30 and ceiling 100 keeps ≥ 90 % busy; when a guaranteed neighbour with request 70 starts, it is
// back at its request within 300 ms, and the neighbour has its 70.
func TestBurstReachesTheCeilingAndComesBack(t *testing.T) {
	for _, tc := range []struct {
		class Class
		wake  bool
	}{{Guaranteed, false}, {BestEffort, false}, {Guaranteed, true}, {BestEffort, true}} {
		class := tc.class
		t.Run(fmt.Sprintf("%s/wake=%v", class, tc.wake), func(t *testing.T) {
			s := newSim(share(class, 30, 100, always(100)), share(Guaranteed, 70, 70, from(5, 100)))
			s.wake = tc.wake
			s.run(10)
			if alone := s.mean(0, 1, 5); alone < 90 {
				t.Errorf("alone, the burster kept %.1f%% busy, want ≥ 90", alone)
			}
			if back := s.settle(0, 5, 30, 2); back > 0.3 {
				t.Errorf("the burster took %.0f ms to come back to its request of 30, want ≤ 300", back*1000)
			}
			if got := s.mean(1, 6, 10); math.Abs(got-70) > 1 {
				t.Errorf("the neighbour kept %.1f%% busy, want its request of 70", got)
			}
			if got := s.mean(0, 6, 10); math.Abs(got-30) > 1 {
				t.Errorf("the burster kept %.1f%% busy beside it, want 30", got)
			}
			t.Logf("alone %.1f%%, back at its request %.0f ms after the neighbour started", s.mean(0, 1, 5), s.settle(0, 5, 30, 2)*1000)
		})
	}
}

// TestBestEffortUsesWhatGuaranteedLeaves: a guaranteed share serving requests that arrive at
// random (busy 40 % of the time at 60 % of the GPU) beside a best-effort share that would take the
// whole GPU: the guaranteed share keeps what it gets alone, and the best-effort one gets ≥ 80 %
// of the time the guaranteed one leaves idle.
func TestBestEffortUsesWhatGuaranteedLeaves(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 26))
	// On/off in blocks of 0.5–2 s.
	var edges []float64
	for t := 0.0; t < 60; t += 0.5 + 1.5*rng.Float64() {
		edges = append(edges, t)
	}
	bursty := func(t float64) float64 {
		i, _ := slices.BinarySearch(edges, t)
		if i%2 == 1 {
			return 60
		}
		return 0
	}
	alone := newSim(share(Guaranteed, 60, 60, bursty))
	alone.run(60)
	s := newSim(share(Guaranteed, 60, 60, bursty), share(BestEffort, 10, 100, always(100)))
	s.run(60)
	g, gAlone := s.mean(0, 1, 60), alone.mean(0, 1, 60)
	if g < gAlone-1 {
		t.Errorf("the guaranteed share kept %.1f%% busy beside a best-effort one, %.1f%% alone", g, gAlone)
	}
	idle := 100 - gAlone
	be := s.mean(1, 1, 60)
	if be < 0.8*idle {
		t.Errorf("the best-effort share got %.1f%% of the GPU; the guaranteed one leaves %.1f%% idle, want ≥ 80%% of it", be, idle)
	}
	t.Logf("guaranteed %.1f%% (alone %.1f%%), best-effort %.1f%% = %.0f%% of the idle time", g, gAlone, be, 100*be/idle)
}

// TestGuaranteedBurstsBeforeBestEffort: idle time goes to guaranteed bursts first.
func TestGuaranteedBurstsBeforeBestEffort(t *testing.T) {
	s := newSim(share(Guaranteed, 20, 60, always(100)), share(BestEffort, 20, 100, always(100)), share(Guaranteed, 40, 40, always(0)))
	s.run(5)
	if g := s.mean(0, 2, 5); math.Abs(g-60) > 2 {
		t.Errorf("the guaranteed burster kept %.1f%% busy, want its ceiling of 60", g)
	}
	if be := s.mean(1, 2, 5); math.Abs(be-40) > 2 {
		t.Errorf("the best-effort share kept %.1f%% busy, want the 40 left", be)
	}
}
