package checkpoint

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// manualFlush stands in for time.AfterFunc: it records what the store scheduled, and the test
// runs it when it chooses.
type manualFlush struct {
	mu     sync.Mutex
	delays []time.Duration
	funcs  []func()
}

func (m *manualFlush) afterFunc(d time.Duration, f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.delays = append(m.delays, d)
	m.funcs = append(m.funcs, f)
}

// scheduled is how many flushes were scheduled so far.
func (m *manualFlush) scheduled() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.funcs)
}

// run runs the i-th scheduled flush.
func (m *manualFlush) run(i int) {
	m.mu.Lock()
	f := m.funcs[i]
	m.mu.Unlock()
	f()
}

func openDeferred(t *testing.T, path string, wc *writeCounter) (*Store, *manualFlush) {
	t.Helper()
	var m manualFlush
	s, err := Open(path, WithFlushDelay(250*time.Millisecond, m.afterFunc))
	if err != nil {
		t.Fatal(err)
	}
	if wc != nil {
		wc.install(s)
	}
	return s, &m
}

// TestRemoveDeferredIsVisibleAtOnceAndDurableAfterTheFlush: readers no longer see a removed
// claim, the file still holds it until the scheduled flush writes, and then a store opened on
// the file does not.
func TestRemoveDeferredIsVisibleAtOnceAndDurableAfterTheFlush(t *testing.T) {
	path := checkpointPath(t)
	var wc writeCounter
	s, m := openDeferred(t, path, &wc)
	if err := s.Update(func(d *Data) error { d.Claims[uidA] = fullClaim(); d.Claims[uidB] = adminClaim(); return nil }); err != nil {
		t.Fatal(err)
	}
	s.RemoveDeferred(uidA)
	if _, ok := s.Get(uidA); ok {
		t.Error("Get still finds the removed claim")
	}
	if n := s.Len(); n != 1 {
		t.Errorf("Len = %d, want 1", n)
	}
	if _, ok := s.Snapshot().Claims[uidA]; ok {
		t.Error("Snapshot still holds the removed claim")
	}
	if uid, _, ok := s.Find(func(string, *Claim) bool { return true }); !ok || uid != uidB {
		t.Errorf("Find = %q, %v; want only %s", uid, ok, uidB)
	}
	var seen []string
	s.Range(func(uid string, _ *Claim) { seen = append(seen, uid) })
	if len(seen) != 1 || seen[0] != uidB {
		t.Errorf("Range saw %v, want [%s]", seen, uidB)
	}
	if wc.count() != 1 {
		t.Errorf("%d writes after RemoveDeferred, want 1 (the Update's): the removal must not wait for the disk", wc.count())
	}
	if _, ok := openStore(t, path).Get(uidA); !ok {
		t.Error("the file lost the claim before any write carried the removal")
	}
	if m.scheduled() != 1 || m.delays[0] != 250*time.Millisecond {
		t.Fatalf("scheduled flushes %v, want one after the flush delay", m.delays)
	}

	m.run(0)
	if wc.count() != 2 {
		t.Errorf("%d writes after the flush, want 2", wc.count())
	}
	if _, ok := openStore(t, path).Get(uidA); ok {
		t.Error("the file still holds the claim after the flush")
	}
	if _, ok := openStore(t, path).Get(uidB); !ok {
		t.Error("the flush lost the other claim")
	}
	// Nothing left to write: a second flush, and Close, write nothing.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if wc.count() != 2 {
		t.Errorf("%d writes after Close with nothing pending, want 2", wc.count())
	}
}

// TestUpdateCarriesDeferredRemovals: the next durable Update writes the removal with its own
// change in one write, and the scheduled flush then has nothing to do.
func TestUpdateCarriesDeferredRemovals(t *testing.T) {
	path := checkpointPath(t)
	var wc writeCounter
	s, m := openDeferred(t, path, &wc)
	if err := s.Update(putClaim(uidA, fullClaim())); err != nil {
		t.Fatal(err)
	}
	s.RemoveDeferred(uidA)
	var sawA bool
	if err := s.Update(func(d *Data) error { _, sawA = d.Claims[uidA]; d.Claims[uidB] = adminClaim(); return nil }); err != nil {
		t.Fatal(err)
	}
	if sawA {
		t.Error("a mutation after the removal saw the removed claim")
	}
	if wc.count() != 2 {
		t.Errorf("%d writes, want 2", wc.count())
	}
	got := openStore(t, path).Snapshot()
	if _, ok := got.Claims[uidA]; ok || len(got.Claims) != 1 {
		t.Errorf("file holds %v, want only %s", got.Claims, uidB)
	}
	m.run(0)
	if wc.count() != 2 {
		t.Errorf("%d writes after a flush with nothing pending, want 2", wc.count())
	}
}

// TestRemovedClaimPreparedAgain: a claim removed and then recorded again before any flush is
// there, in memory and on disk; removing an unknown claim changes nothing.
func TestRemovedClaimPreparedAgain(t *testing.T) {
	path := checkpointPath(t)
	s, m := openDeferred(t, path, nil)
	if err := s.Update(putClaim(uidA, fullClaim())); err != nil {
		t.Fatal(err)
	}
	s.RemoveDeferred(uidA)
	s.RemoveDeferred(uidB) // unknown: nothing to do
	if err := s.Update(putClaim(uidA, fullClaim())); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get(uidA); !ok {
		t.Fatal("the claim recorded again is not there")
	}
	m.run(0)
	if _, ok := openStore(t, path).Get(uidA); !ok {
		t.Error("the flush removed the claim recorded again")
	}
}

// TestRemovalDuringAWriteWaitsForTheNext: a removal made while a batch is being written is not
// lost when that batch publishes its state, and not counted as written either.
func TestRemovalDuringAWriteWaitsForTheNext(t *testing.T) {
	path := checkpointPath(t)
	var wc writeCounter
	s, m := openDeferred(t, path, &wc)
	if err := s.Update(putClaim(uidA, fullClaim())); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	wc.beforeWrite = func(n int) error {
		if n == 2 {
			<-release
		}
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- s.Update(putClaim(uidB, adminClaim())) }()
	if err := waitWrites(&wc, 2); err != nil {
		t.Fatal(err)
	}
	s.RemoveDeferred(uidA) // while the file is being written
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get(uidA); ok {
		t.Error("the batch that was being written brought the removed claim back")
	}
	if _, ok := openStore(t, path).Get(uidA); !ok {
		t.Error("the batch that was being written carried a removal made after it was taken")
	}
	m.run(0)
	if _, ok := openStore(t, path).Get(uidA); ok {
		t.Error("the flush did not write the removal")
	}
}

// TestFailedFlushIsRetried: a flush whose write fails keeps the removal (readers still do not
// see the claim) and schedules another; the next one writes it.
func TestFailedFlushIsRetried(t *testing.T) {
	path := checkpointPath(t)
	var wc writeCounter
	s, m := openDeferred(t, path, &wc)
	if err := s.Update(putClaim(uidA, fullClaim())); err != nil {
		t.Fatal(err)
	}
	errDisk := errors.New("injected write failure")
	wc.beforeWrite = func(n int) error {
		if n == 2 {
			return errDisk
		}
		return nil
	}
	s.RemoveDeferred(uidA)
	m.run(0)
	if _, ok := s.Get(uidA); ok {
		t.Error("a failed flush brought the removed claim back")
	}
	if m.scheduled() != 2 {
		t.Fatalf("%d flushes scheduled after a failed one, want 2", m.scheduled())
	}
	m.run(1)
	if _, ok := openStore(t, path).Get(uidA); ok {
		t.Error("the retried flush did not write the removal")
	}
}

// TestCloseFlushesAndStopsScheduling: Close writes what is pending; a removal after it is
// written by the next Update or Flush, never by a timer.
func TestCloseFlushesAndStopsScheduling(t *testing.T) {
	path := checkpointPath(t)
	s, m := openDeferred(t, path, nil)
	if err := s.Update(func(d *Data) error { d.Claims[uidA] = fullClaim(); d.Claims[uidB] = adminClaim(); return nil }); err != nil {
		t.Fatal(err)
	}
	s.RemoveDeferred(uidA)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := openStore(t, path).Get(uidA); ok {
		t.Error("Close did not write the pending removal")
	}
	s.RemoveDeferred(uidB)
	if m.scheduled() != 1 {
		t.Errorf("%d flushes scheduled, want only the one before Close", m.scheduled())
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, ok := openStore(t, path).Get(uidB); ok {
		t.Error("Flush did not write the removal")
	}
}

// TestSealWritesDeferredRemovals: the next owner reads the file Seal leaves (contract §14), so
// a claim unprepared before the fence must not be in it; a flush scheduled before the seal
// writes nothing and schedules no other, and Unseal schedules what a sealed store kept.
func TestSealWritesDeferredRemovals(t *testing.T) {
	path := checkpointPath(t)
	var wc writeCounter
	s, m := openDeferred(t, path, &wc)
	if err := s.Update(func(d *Data) error { d.Claims[uidA] = fullClaim(); d.Claims[uidB] = adminClaim(); return nil }); err != nil {
		t.Fatal(err)
	}
	s.RemoveDeferred(uidA)
	if err := s.Seal(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d, err := Load(path); err != nil {
		t.Fatal(err)
	} else if len(d.Claims) != 1 {
		t.Fatalf("the sealed file holds %d claims, want 1 (the removal written)", len(d.Claims))
	}
	writes := wc.count()
	s.RemoveDeferred(uidB) // nothing should unprepare after the fence; if it does, the file stays
	m.run(0)
	if m.scheduled() != 1 {
		t.Errorf("%d flushes scheduled, want the sealed store's to stop", m.scheduled())
	}
	if wc.count() != writes {
		t.Error("a sealed store wrote the file")
	}
	s.Unseal()
	if m.scheduled() != 2 {
		t.Fatalf("%d flushes scheduled after Unseal, want the kept removal's", m.scheduled())
	}
	m.run(1)
	if d, _ := Load(path); len(d.Claims) != 0 {
		t.Errorf("after Unseal the flush left %d claims in the file", len(d.Claims))
	}
}
