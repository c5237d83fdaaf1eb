package checkpoint

import "maps"

// GPUTotals is what the results of the recorded claims take of one GPU, in the checkpoint's
// terms: a result recorded with 0 memory or 0 cores takes the whole of it, and an admin-access
// result takes nothing (Device). The store keeps them per GPU as claims come and go, so that
// Prepare's capacity check and the usage metrics read a GPU's totals instead of walking every
// claim.
type GPUTotals struct {
	// MemoryBytes sums the results' memory limits; WholeMemory counts the results without one.
	MemoryBytes int64
	WholeMemory int
	// Cores sums the results' core limits; WholeCores counts the results without one.
	Cores      int64
	WholeCores int
	// Results counts the results on the GPU (its shares).
	Results int
}

// Add counts one more result; an admin-access result changes nothing.
func (t *GPUTotals) Add(dev Device) { t.add(dev, 1) }

// Remove takes one result out again.
func (t *GPUTotals) Remove(dev Device) { t.add(dev, -1) }

func (t *GPUTotals) add(dev Device, sign int) {
	if dev.AdminAccess {
		return
	}
	t.Results += sign
	if dev.MemoryBytes == 0 {
		t.WholeMemory += sign
	} else {
		t.MemoryBytes += int64(sign) * dev.MemoryBytes
	}
	if dev.Cores == 0 {
		t.WholeCores += sign
	} else {
		t.Cores += int64(sign) * dev.Cores
	}
}

// gpuTotals are the totals of a set of claims by GPU UUID; a GPU none of them takes anything of
// has no entry. A published one is never modified (views share it); change a clone.
type gpuTotals map[string]GPUTotals

// totalsOf sums claims in full: at Open, and in the tests that check the running totals.
func totalsOf(claims map[string]Claim) gpuTotals {
	t := gpuTotals{}
	for _, c := range claims {
		t.addClaim(c, 1)
	}
	return t
}

func (t gpuTotals) clone() gpuTotals {
	if t == nil {
		return gpuTotals{}
	}
	return maps.Clone(t)
}

// addClaim adds (sign 1) or removes (sign -1) the results of c, in place.
func (t gpuTotals) addClaim(c Claim, sign int) {
	for _, dev := range c.Devices {
		if dev.AdminAccess {
			continue
		}
		key := dev.CapacityKey()
		g := t[key]
		g.add(dev, sign)
		if g == (GPUTotals{}) {
			delete(t, key)
		} else {
			t[key] = g
		}
	}
}

// applied returns t, the totals of base, moved to base with changed applied (batchState).
func (t gpuTotals) applied(base *Data, changed map[string]*Claim) gpuTotals {
	if len(changed) == 0 {
		return t
	}
	out := t.clone()
	for uid, c := range changed {
		if old, ok := base.Claims[uid]; ok {
			out.addClaim(old, -1)
		}
		if c != nil {
			out.addClaim(*c, 1)
		}
	}
	return out
}

// Totals is what the claims of one published state take of each GPU, with those claims: a
// consistent pair, however the store changes meanwhile. Its claims are deferred removals less,
// as every reader sees them.
type Totals struct{ v *view }

// Totals returns the per-GPU totals of the claims readers see now, without walking them.
func (s *Store) Totals() Totals { return Totals{s.view.Load()} }

// GPU returns what the claims take of the GPU of that UUID, or of the partition of a capacity
// key (Device.CapacityKey): a GPU's figure leaves its partitions out.
func (t Totals) GPU(uuid string) GPUTotals { return t.v.totals[uuid] }

// Devices returns the recorded results of one claim of this state, without copying: the caller
// must not keep or modify them.
func (t Totals) Devices(uid string) ([]Device, bool) {
	c, ok := t.v.get(uid)
	return c.Devices, ok
}
