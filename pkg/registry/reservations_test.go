package registry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeReader answers ReservedFor with pods, or err; gate, when set, holds every read until
// it is closed.
type fakeReader struct {
	reads atomic.Int32
	mu    sync.Mutex
	pods  []string
	err   error
	gate  chan struct{}
}

func (f *fakeReader) ReservedFor(ctx context.Context, _ string) ([]string, error) {
	f.reads.Add(1)
	f.mu.Lock()
	gate, pods, err := f.gate, f.pods, f.err
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return pods, err
}

// TestReservationsReadBound: a miss reads the claim; within RefreshInterval of a read no
// other read starts (a pod the read did not list waits for the rest of the interval, one
// it listed is reserved); concurrent misses share one read; an API error is returned, and
// the next miss within the interval waits; a cancelled wait ends; old reads are pruned.
func TestReservationsReadBound(t *testing.T) {
	const interval = time.Second
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	f := &fakeReader{pods: []string{"a", "b"}}
	r := newReservations(f, time.Minute, interval, clock)
	ctx := context.Background()

	if ok, wait, err := r.check(ctx, "c1", "b"); !ok || wait != 0 || err != nil || f.reads.Load() != 1 {
		t.Fatalf("first miss: reserved=%v wait=%v err=%v reads=%d; want reserved after one read", ok, wait, err, f.reads.Load())
	}
	now = now.Add(300 * time.Millisecond)
	if ok, _, _ := r.check(ctx, "c1", "a"); !ok {
		t.Fatal("a pod the recent read listed is not reserved")
	}
	if ok, wait, err := r.check(ctx, "c1", "x"); ok || err != nil || wait != 700*time.Millisecond {
		t.Fatalf("a pod the recent read did not list: reserved=%v wait=%v err=%v; want wait 700ms", ok, wait, err)
	}
	if f.reads.Load() != 1 {
		t.Fatalf("%d reads within the interval, want 1", f.reads.Load())
	}
	if ok, _, _ := r.check(ctx, "c2", "a"); !ok || f.reads.Load() != 2 {
		t.Fatalf("another claim is read on its own: reads=%d", f.reads.Load())
	}

	now = now.Add(interval)
	f.mu.Lock()
	f.gate, f.pods = make(chan struct{}), []string{"a", "b", "x"}
	f.mu.Unlock()
	var wg sync.WaitGroup
	results := make(chan bool, 4)
	for range 4 {
		wg.Go(func() {
			ok, _, err := r.check(ctx, "c1", "x")
			results <- ok && err == nil
		})
	}
	for f.reads.Load() != 3 {
		time.Sleep(time.Millisecond)
	}
	waiting, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := r.check(waiting, "c1", "x"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait for a read in progress: %v", err)
	}
	close(f.gate)
	wg.Wait()
	close(results)
	for ok := range results {
		if !ok {
			t.Fatal("a miss that shared the read in progress did not see its pod")
		}
	}
	if f.reads.Load() != 3 {
		t.Fatalf("%d reads for 4 concurrent misses, want one more", f.reads.Load())
	}

	now = now.Add(interval)
	apiErr := errors.New("API server unreachable")
	f.mu.Lock()
	f.gate, f.err = nil, apiErr
	f.mu.Unlock()
	if _, _, err := r.check(ctx, "c1", "y"); !errors.Is(err, apiErr) {
		t.Fatalf("read error: %v", err)
	}
	if ok, wait, err := r.check(ctx, "c1", "y"); ok || err != nil || wait != interval {
		t.Fatalf("miss right after a failed read: reserved=%v wait=%v err=%v; want a wait", ok, wait, err)
	}

	now = now.Add(interval)
	r.prune()
	r.mu.Lock()
	left := len(r.reads)
	r.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d claims' reads left after the interval", left)
	}
}
