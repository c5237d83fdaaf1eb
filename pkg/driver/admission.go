package driver

import (
	"iter"
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
	if err := d.checkCapacity(a.prepared(d.deps.Checkpoint), uid, devs); err != nil {
		return nil, err
	}
	a.pending[uid] = devs
	return func() {
		a.mu.Lock()
		delete(a.pending, uid)
		a.mu.Unlock()
	}, nil
}

// prepared yields the claims of the checkpoint and those being prepared, each once: a claim
// whose record was written before its admission was released is in both. Called under mu.
func (a *admissions) prepared(store *checkpoint.Store) iter.Seq2[string, []checkpoint.Device] {
	return func(yield func(string, []checkpoint.Device) bool) {
		stop := false
		store.Range(func(uid string, c *checkpoint.Claim) {
			if _, pending := a.pending[uid]; !pending && !stop {
				stop = !yield(uid, c.Devices)
			}
		})
		for uid, devs := range a.pending {
			if stop || !yield(uid, devs) {
				return
			}
		}
	}
}
