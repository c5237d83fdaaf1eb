package checkpoint

import (
	"errors"
	"reflect"
	"slices"
	"testing"
)

// gatedStore returns a store whose first write waits until release is closed, and the
// function that starts one Update in the background and waits until it is queued (so that
// the order of the next batch is the order of the calls).
func gatedStore(t *testing.T, path string, wc *writeCounter, writeErr func(n int) error) (*Store, chan struct{}, func(func(*Data) error) <-chan error) {
	t.Helper()
	s := openStore(t, path)
	release := make(chan struct{})
	wc.install(s)
	wc.beforeWrite = func(n int) error {
		if n == 1 {
			<-release
		}
		if writeErr != nil {
			return writeErr(n)
		}
		return nil
	}
	queued := 0
	start := func(mutate func(*Data) error) <-chan error {
		ch := make(chan error, 1)
		go func() { ch <- s.Update(mutate) }()
		queued++
		if err := waitQueued(s, queued); err != nil {
			t.Fatal(err)
		}
		return ch
	}
	return s, release, start
}

// TestFailingMutationLeavesNoTrace puts a failing mutation between two good ones in one
// batch. It replaces an existing claim with a changed record, adds a claim and deletes a
// batch-mate's; none of that may survive, and its batch-mates must land. (Changing a record's
// slices in place is what no mutation may do: TestCopyOnWriteLeavesHeldRecordsAlone.)
func TestFailingMutationLeavesNoTrace(t *testing.T) {
	path := checkpointPath(t)
	var wc writeCounter
	s, release, start := gatedStore(t, path, &wc, nil)
	// First batch: claim A alone, held in its write while the second batch queues up.
	first := make(chan error, 1)
	go func() { first <- s.Update(putClaim(uidA, fullClaim())) }()
	if err := waitWrites(&wc, 1); err != nil {
		t.Fatal(err)
	}

	errBoom := errors.New("boom")
	const ok1, ok2, bad = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222", "33333333-3333-4333-8333-333333333333"
	var ok2SawOK1 bool
	r1 := start(putClaim(ok1, Claim{Name: "ok1"}))
	rBad := start(func(d *Data) error {
		tampered := d.Claims[uidA]
		tampered.ReservedFor = []string{"tampered"}
		d.Claims[uidA] = tampered
		d.Claims[bad] = Claim{Name: "bad"}
		delete(d.Claims, ok1)
		d.BootID = "tampered"
		return errBoom
	})
	r2 := start(func(d *Data) error {
		_, ok2SawOK1 = d.Claims[ok1]
		d.Claims[ok2] = Claim{Name: "ok2"}
		return nil
	})
	close(release)

	if err := <-first; err != nil {
		t.Fatalf("first batch: %v", err)
	}
	if err := <-r1; err != nil {
		t.Errorf("ok1: %v", err)
	}
	if err := <-rBad; !errors.Is(err, errBoom) {
		t.Errorf("failing mutation: Update = %v, want %v", err, errBoom)
	}
	if err := <-r2; err != nil {
		t.Errorf("ok2: %v", err)
	}
	if !ok2SawOK1 {
		t.Error("ok2 did not see ok1, the earlier mutation of its batch")
	}
	if got := wc.count(); got != 2 {
		t.Errorf("%d writes, want 2 (one per batch)", got)
	}
	want := Data{Claims: map[string]Claim{uidA: fullClaim(), ok1: {Name: "ok1"}, ok2: {Name: "ok2"}}}
	if got := s.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Errorf("Snapshot = %+v, want %+v", got, want)
	}
	if got := openStore(t, path).Snapshot(); !reflect.DeepEqual(got, want) {
		t.Errorf("file holds %+v, want %+v", got, want)
	}
}

// TestWriteFailureFailsWholeBatch: every caller of a batch whose write fails gets the error,
// the durable state stays, and the next batch succeeds.
func TestWriteFailureFailsWholeBatch(t *testing.T) {
	path := checkpointPath(t)
	var wc writeCounter
	errDisk := errors.New("injected write failure")
	s, release, start := gatedStore(t, path, &wc, func(n int) error {
		if n == 2 {
			return errDisk
		}
		return nil
	})
	first := make(chan error, 1)
	go func() { first <- s.Update(putClaim(uidA, fullClaim())) }()
	if err := waitWrites(&wc, 1); err != nil {
		t.Fatal(err)
	}
	results := []<-chan error{
		start(putClaim("11111111-1111-4111-8111-111111111111", Claim{})),
		start(putClaim("22222222-2222-4222-8222-222222222222", Claim{})),
		start(func(d *Data) error { delete(d.Claims, uidA); return nil }),
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first batch: %v", err)
	}
	for i, r := range results {
		err := <-r
		if !errors.Is(err, errDisk) {
			t.Errorf("caller %d: Update = %v, want the write error", i, err)
		}
	}
	want := Data{Claims: map[string]Claim{uidA: fullClaim()}}
	if got := s.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Errorf("Snapshot after a failed write = %+v, want %+v", got, want)
	}
	if err := s.Update(putClaim(uidB, Claim{Name: "b"})); err != nil {
		t.Fatalf("Update after a failed write: %v", err)
	}
	got := openStore(t, path).Snapshot()
	if uids := []string{uidA, uidB}; len(got.Claims) != 2 || !hasClaims(got, uids) {
		t.Errorf("file holds %+v, want claims %v", got.Claims, uids)
	}
}

func TestPanickingMutationPanicsInItsCaller(t *testing.T) {
	path := checkpointPath(t)
	s := openStore(t, path)
	func() {
		defer func() {
			if r := recover(); r != "mutation bug" {
				t.Errorf("recovered %v, want the mutation's panic value", r)
			}
		}()
		_ = s.Update(func(d *Data) error { d.BootID = "x"; panic("mutation bug") })
	}()
	if err := s.Update(putClaim(uidA, Claim{Name: "a"})); err != nil {
		t.Fatalf("Update after a panic: %v", err)
	}
	if got := s.Snapshot(); got.BootID != "" || len(got.Claims) != 1 {
		t.Errorf("Snapshot = %+v, want only claim A and no boot ID", got)
	}
}

func hasClaims(d Data, uids []string) bool {
	return !slices.ContainsFunc(uids, func(uid string) bool { _, ok := d.Claims[uid]; return !ok })
}

// waitWrites waits until at least n writes have started.
func waitWrites(wc *writeCounter, n int) error {
	return pollUntil(func() bool { return wc.count() >= n })
}
