package deviceplugin

import (
	"fmt"
	"slices"
)

// Policy is how GetPreferredAllocation picks shares beyond the ones that must be included.
type Policy string

const (
	// PolicyBinpack uses as few GPUs as possible, and of those the fullest that fit: whole
	// GPUs stay free for containers that need them. The default.
	PolicyBinpack Policy = "binpack"
	// PolicySpread uses as many GPUs as possible, the emptiest first: containers contend less.
	PolicySpread Policy = "spread"
)

// gpuPick is one GPU's available shares during a preference.
type gpuPick struct {
	gpu   int      // position in Inventory.GPUs
	free  []*Share // available, not yet picked, ascending
	taken int      // picked for this container (must-include counted)
}

// preferred answers one container's GetPreferredAllocation: every must-include ID first, in
// the kubelet's order, then shares from available by the policy until size IDs are chosen. It
// never fails: IDs it does not know are used last, as they come, and when too few are
// available it answers what there is (the kubelet decides). Deterministic: ties go to the
// lower GPU index, then the lower share number.
func (inv *Inventory) preferred(policy Policy, available, mustInclude []string, size int) []string {
	out := make([]string, 0, max(size, len(mustInclude)))
	chosen := make(map[string]bool, size)
	for _, id := range mustInclude {
		if !chosen[id] {
			chosen[id] = true
			out = append(out, id)
		}
	}
	picks := make([]*gpuPick, len(inv.GPUs))
	for i := range picks {
		picks[i] = &gpuPick{gpu: i}
	}
	for id := range chosen {
		if sh, ok := inv.byID[id]; ok {
			picks[sh.GPU].taken++
		}
	}
	var unknown []string
	for _, id := range available {
		if chosen[id] {
			continue
		}
		chosen[id] = true // an ID listed twice is offered once
		sh, ok := inv.byID[id]
		if !ok {
			unknown = append(unknown, id)
			continue
		}
		picks[sh.GPU].free = append(picks[sh.GPU].free, sh)
	}
	for _, p := range picks {
		slices.SortFunc(p.free, less)
	}
	need := size - len(out)
	for need > 0 {
		p := choose(policy, picks, need)
		if p == nil {
			break
		}
		n := 1
		if policy != PolicySpread {
			n = min(need, len(p.free)) // binpack takes what it can from the chosen GPU
		}
		for _, sh := range p.free[:n] {
			out = append(out, sh.ID)
		}
		p.free, p.taken, need = p.free[n:], p.taken+n, need-n
	}
	for _, id := range unknown {
		if need <= 0 {
			break
		}
		out, need = append(out, id), need-1
	}
	return out
}

// choose picks the GPU to take from next, or nil when none has a free share.
//
// binpack: a GPU this container already uses, the one with fewest free shares first (fill it);
// else the GPU with the fewest free shares that still holds all that is needed (the fullest
// that fits); else the one with the most free shares (fewest GPUs in all).
//
// spread: the GPU this container uses least, then the one with the most free shares.
func choose(policy Policy, picks []*gpuPick, need int) *gpuPick {
	var best *gpuPick
	better := func(p *gpuPick) bool {
		if best == nil {
			return true
		}
		if policy == PolicySpread {
			if p.taken != best.taken {
				return p.taken < best.taken
			}
			return len(p.free) > len(best.free)
		}
		if (p.taken > 0) != (best.taken > 0) {
			return p.taken > 0
		}
		if p.taken > 0 {
			return len(p.free) < len(best.free)
		}
		pFits, bestFits := len(p.free) >= need, len(best.free) >= need
		switch {
		case pFits != bestFits:
			return pFits
		case pFits:
			return len(p.free) < len(best.free)
		default:
			return len(p.free) > len(best.free)
		}
	}
	for _, p := range picks { // ascending GPU order: a strict improvement is needed to move on
		if len(p.free) > 0 && better(p) {
			best = p
		}
	}
	return best
}

// preferredSafe is preferred that cannot fail the kubelet's admission: a panic (a bug) is
// logged by the caller through the returned error, and the answer falls back to the
// must-include IDs followed by the available ones in the kubelet's order.
func (inv *Inventory) preferredSafe(policy Policy, available, mustInclude []string, size int) (ids []string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("preferred allocation panicked: %v", r)
			ids = fallbackPreference(available, mustInclude, size)
		}
	}()
	return inv.preferred(policy, available, mustInclude, size), nil
}

func fallbackPreference(available, mustInclude []string, size int) []string {
	out := slices.Clone(mustInclude)
	for _, id := range available {
		if len(out) >= size {
			break
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}
