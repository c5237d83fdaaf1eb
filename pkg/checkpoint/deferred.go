package checkpoint

import (
	"errors"
	"fmt"
)

// view is one published state for readers (see Store.view).
type view struct {
	durable *Data
	// removed holds claims that RemoveDeferred took out and no write has carried yet; nil
	// when there are none.
	removed map[string]struct{}
	// durableTotals are the per-GPU totals of durable, totals those of what readers see (durable
	// less removed).
	durableTotals, totals gpuTotals
}

// newView is the view of durable, whose totals are durableTotals, less the claims removed.
func newView(durable *Data, durableTotals gpuTotals, removed map[string]struct{}) *view {
	v := &view{durable: durable, removed: removed, durableTotals: durableTotals, totals: durableTotals}
	copied := false
	for uid := range removed {
		c, ok := durable.Claims[uid]
		if !ok {
			continue
		}
		if !copied {
			v.totals, copied = durableTotals.clone(), true
		}
		v.totals.addClaim(c, -1)
	}
	return v
}

// get returns the claim as readers see it, without copying.
func (v *view) get(uid string) (Claim, bool) {
	if _, gone := v.removed[uid]; gone {
		return Claim{}, false
	}
	c, ok := v.durable.Claims[uid]
	return c, ok
}

// RemoveDeferred removes a claim from the state at once, for every reader, and returns without
// waiting for the disk: the next write carries the removal — any Update's (a Prepare's, which
// costs nothing more), or one of its own at most the flush delay later. A crash before that
// leaves the claim in the file; start-up recovery then restores its files and the
// reconciliation with the API server unprepares it (contract §7). Unprepare uses it: the kubelet
// has been told the claim is gone and never asks again, so nothing waits on its durability.
// A claim that is not there is no error.
func (s *Store) RemoveDeferred(claimUID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.view.Load()
	c, ok := v.get(claimUID)
	if !ok {
		return
	}
	removed := make(map[string]struct{}, len(v.removed)+1)
	for uid := range v.removed {
		removed[uid] = struct{}{}
	}
	removed[claimUID] = struct{}{}
	totals := v.totals.clone()
	totals.addClaim(c, -1)
	s.view.Store(&view{durable: v.durable, removed: removed, durableTotals: v.durableTotals, totals: totals})
	if !s.flushPending && !s.closed {
		s.flushPending = true
		s.afterFunc(s.flushDelay, s.flushLater)
	}
}

// flushLater is the scheduled write of deferred removals. A failed write is tried again a flush
// delay later; each Update in between tries it too and reports the error to its caller.
func (s *Store) flushLater() {
	s.mu.Lock()
	s.flushPending = false
	s.mu.Unlock()
	// A sealed store writes nothing more (Seal wrote every removal made before it); Unseal
	// schedules again what is left.
	if err := s.Flush(); err != nil && !errors.Is(err, ErrSealed) {
		s.mu.Lock()
		if !s.flushPending && !s.closed {
			s.flushPending = true
			s.afterFunc(s.flushDelay, s.flushLater)
		}
		s.mu.Unlock()
	}
}

// Flush writes the removals that RemoveDeferred made and no write has carried yet, and returns
// when they are durable; with none it does nothing.
func (s *Store) Flush() error {
	if len(s.view.Load().removed) == 0 {
		return nil
	}
	return s.enqueue(func(*batchState) error { return nil })
}

// Close flushes the deferred removals and schedules no more flushes; the store stays readable
// and Update still works. The plugin calls it when it stops.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	if err := s.Flush(); err != nil {
		return fmt.Errorf("write the deferred removals to checkpoint %s: %w", s.path, err)
	}
	return nil
}
