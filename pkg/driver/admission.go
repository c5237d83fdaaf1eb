package driver

import (
	"sync"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
)

// admissions are the claims whose Prepare passed the capacity check and whose checkpoint record
// is not yet written. Prepare records a claim once, when everything exists (contract §7), so
// the claims being prepared are not in the checkpoint: they are here instead, and the capacity
// check counts both. Checking and admitting happen under one lock, so two concurrent Prepares
// that together would overcommit a GPU cannot both pass — what running the check inside the
// checkpoint's update gave before, without holding a checkpoint batch open for it.
type admissions struct {
	mu      sync.Mutex
	pending map[string][]checkpoint.Device // by claim UID
}

func newAdmissions() *admissions {
	return &admissions{pending: map[string][]checkpoint.Device{}}
}

// admit checks that the claim fits next to every prepared claim and every claim being prepared,
// and counts it among the latter until release is called. release must be called once the
// claim's checkpoint record is written or its Prepare failed.
func (d *Driver) admit(uid string, devs []checkpoint.Device) (release func(), err error) {
	a := d.admitted
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := d.checkCapacity(a.takenBesides(d.deps.Checkpoint.Totals(), uid), devs); err != nil {
		return nil, err
	}
	a.pending[uid] = devs
	return func() {
		a.mu.Lock()
		delete(a.pending, uid)
		a.mu.Unlock()
	}, nil
}

// takenBesides returns what the claims of the checkpoint (its running totals, read once) and
// those being prepared take of a GPU or a partition (checkpoint.Device.CapacityKey), the claim uid's own results left out. A claim whose record
// was written before its admission was released is in both, and counted once. It walks no
// recorded claim: only the claims being prepared, as many as Prepares in flight. Called under mu.
func (a *admissions) takenBesides(recorded checkpoint.Totals, uid string) func(capacityKey string) checkpoint.GPUTotals {
	own, ownRecorded := recorded.Devices(uid)
	return func(key string) checkpoint.GPUTotals {
		t := recorded.GPU(key)
		if ownRecorded {
			for _, dev := range own {
				if dev.CapacityKey() == key {
					t.Remove(dev)
				}
			}
		}
		for other, devs := range a.pending {
			if other == uid {
				continue
			}
			if _, inTotals := recorded.Devices(other); inTotals {
				continue
			}
			for _, dev := range devs {
				if dev.CapacityKey() == key {
					t.Add(dev)
				}
			}
		}
		return t
	}
}
