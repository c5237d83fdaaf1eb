package arbiter

import (
	"cmp"
	"math"
	"slices"
)

// Class is a share's service class (contract §16): who gets a GPU's idle time first and who
// gives it back first.
type Class string

const (
	// Guaranteed shares burst into idle time before best-effort ones, and take it back first.
	Guaranteed Class = "Guaranteed"
	// BestEffort shares use what the guaranteed shares of the GPU leave idle.
	BestEffort Class = "BestEffort"
)

// Policy constants (contract §16, "The division").
const (
	// Headroom is how far, in percentage points, a share's allowance stays above what it used
	// in the last pass when it did not use all of its allowance: room to grow into before the
	// next pass sees it.
	Headroom = 5.0
	// idleUtil: a share that kept less than this busy in the last pass has no work.
	idleUtil = 1.0
	// MinAllowance is the least allowance a share with a request is ever given: the library
	// treats a core limit of 0 as none.
	MinAllowance = 1.0
)

// Share is one target's part of one GPU in one pass, as the arbiter sees it: the terms its
// claim gives it (from the checkpoint, never from a file the container can write) and what NVML
// says it used.
type Share struct {
	// Key identifies the target (enforce.Target.Key).
	Key string
	// Class is its service class; empty is Guaranteed.
	Class Class
	// Request is the cores the scheduler counted for it on this GPU, percent (1–100).
	Request float64
	// Ceiling is the most it may use when others leave the GPU idle, percent (≥ Request, ≤ 100).
	Ceiling float64
	// Util is the SM utilisation its processes kept busy in the last pass, percent.
	Util float64
	// Prev is its allowance after the previous pass; 0 is none yet (its request).
	Prev float64
	// Woken: its library said, since the last pass or in the one before, that it has work
	// (contract §16, "Waking"); a guaranteed share's demand is then at least its request.
	Woken bool
}

// Divide returns the allowance of each share of one GPU (same order as shares), in percent.
//
// The rules (contract §16):
//  1. A share's demand: none when idle; its ceiling when it used all of its previous allowance
//     (it may want more: the arbiter cannot see work that its limiter holds back); otherwise what
//     it used plus Headroom. When the GPU is saturated (the shares' utilisation adds up to 100
//     less Headroom), an active share under its request may be held back by the time-slicing, not
//     by want of work: its demand is then at least its request.
//  2. Every share is entitled to its request: its allowance never falls below it, so a share
//     that wakes up gets its request at once, without waiting for a pass.
//  3. What the shares' demands leave of their requests, and what no request holds, is the free
//     part; it goes to the shares that want more than their request, guaranteed ones first, then
//     best-effort ones, each class in proportion to the requests, up to each share's ceiling.
//
// A burst is therefore lent, not given: the pass after another share wants its request back, the
// burster's allowance is back at its own request.
func Divide(shares []Share) []float64 {
	out := make([]float64, len(shares))
	demand := make([]float64, len(shares))
	total, active := 0.0, 0
	for _, s := range shares {
		total += max(s.Util, 0)
		if s.Util >= idleUtil {
			active++
		}
	}
	// On a saturated GPU the time-slicing gives each context with work an equal part: a share
	// that got about that much may have wanted more; one that got well under it had no more work.
	slice := -1.0
	if total >= 100-Headroom && active > 0 {
		slice = 100/float64(active) - Headroom
	}
	free := 100.0
	for i, s := range shares {
		req, ceil := terms(s)
		demand[i] = demandOfWoken(s, req, demandOf(s, req, ceil, slice >= 0 && s.Util >= slice))
		free -= min(demand[i], req)
		out[i] = req
	}
	free = max(free, 0)
	for _, class := range []Class{Guaranteed, BestEffort} {
		free = lend(shares, demand, out, class, free)
	}
	for i := range out {
		out[i] = math.Round(out[i])
	}
	return out
}

// terms are the share's request and ceiling, bounded to what a core limit can be.
func terms(s Share) (req, ceil float64) {
	req = min(max(s.Request, MinAllowance), 100)
	ceil = min(max(s.Ceiling, req), 100)
	return req, ceil
}

func demandOf(s Share, req, ceil float64, heldBack bool) float64 {
	prev := s.Prev
	if prev <= 0 {
		prev = req
	}
	var d float64
	switch {
	case s.Util < idleUtil:
		return 0
	case s.Util >= prev-Headroom:
		d = ceil
	default:
		d = min(ceil, s.Util+Headroom)
	}
	if heldBack && d < req {
		d = req
	}
	return d
}

// demandOfWoken is a share's demand when its wake counts: a guaranteed share that woke wants at
// least its request, whatever the last pass measured (NVML has not seen its work yet).
func demandOfWoken(s Share, req, d float64) float64 {
	if s.Woken && classOf(s) == Guaranteed {
		return max(d, req)
	}
	return d
}

// lend gives free to the shares of the class that want more than their request, in proportion
// to their requests, each up to its demand (water-filling); it returns what is left.
func lend(shares []Share, demand, out []float64, class Class, free float64) float64 {
	var want []int
	for i, s := range shares {
		if classOf(s) == class && demand[i] > out[i] {
			want = append(want, i)
		}
	}
	// Smallest remaining want per unit of weight first: those are filled, the rest share what
	// is left.
	slices.SortFunc(want, func(a, b int) int {
		return cmp.Compare((demand[a]-out[a])/out[a], (demand[b]-out[b])/out[b])
	})
	weight := 0.0
	for _, i := range want {
		weight += out[i]
	}
	for _, i := range want {
		if free <= 0 || weight <= 0 {
			break
		}
		w := out[i]
		give := min(demand[i]-out[i], free*w/weight)
		out[i] += give
		free -= give
		weight -= w
	}
	return free
}

func classOf(s Share) Class {
	if s.Class == BestEffort {
		return BestEffort
	}
	return Guaranteed
}
