package nri

import (
	"context"
	"errors"
	"testing"
	"time"
)

// blockingRefresh makes ReservedFor wait until release is closed, and reports each call on
// entered, so a test can hold a CreateContainer in flight.
func blockingRefresh(f *fixture, entered chan<- struct{}, release <-chan struct{}) {
	f.claims.refresh = func(ctx context.Context, _ string) ([]string, error) {
		entered <- struct{}{}
		<-release
		return []string{podA, podB}, nil
	}
}

// TestDrainAnswersInFlightAndFailsNew: Drain waits for the CreateContainer in flight and lets it
// finish with its adjustment, while a vGPU container arriving meanwhile fails (never created
// without us) and a container without a claim passes untouched.
func TestDrainAnswersInFlightAndFailsNew(t *testing.T) {
	c := testClaim(claimA, gpu0, gpu1)
	f := newFixture(t, c)
	if _, err := f.plugin.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	blockingRefresh(f, entered, release)
	type result struct {
		mounts int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		// Pod B is not in the recorded reservedFor: the hook reads the claim and waits there.
		adj, err := f.create(pod(podB), vgpuContainer("in-flight", pod(podB), "app", c, false))
		done <- result{len(adj.GetMounts()), err}
	}()
	<-entered

	drained := make(chan error, 1)
	go func() { drained <- f.plugin.inflight.drain(context.Background()) }()
	waitFor(t, func() bool {
		f.plugin.inflight.mu.Lock()
		defer f.plugin.inflight.mu.Unlock()
		return f.plugin.inflight.draining
	})

	if _, err := f.create(pod(podA), vgpuContainer("late", pod(podA), "other", c, false)); !errors.Is(err, errDraining) {
		t.Errorf("a vGPU container arriving while draining: %v, want it failed with errDraining", err)
	}
	if adj, err := f.create(pod(podA), vgpuContainer("plain", pod(podA), "plain", Claim{}, false)); adj != nil || err != nil {
		t.Errorf("a container without a claim while draining: %v, %v; want it untouched", adj, err)
	}
	select {
	case err := <-drained:
		t.Fatalf("drain returned (%v) while a CreateContainer was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if r := <-done; r.err != nil || r.mounts != 3 {
		t.Errorf("the in-flight CreateContainer: %d mounts, %v; want its full adjustment", r.mounts, r.err)
	}
	if err := <-drained; err != nil {
		t.Errorf("drain: %v", err)
	}
}

// TestDrainDeadline: drain gives up when its context ends with a request still in flight.
func TestDrainDeadline(t *testing.T) {
	c := testClaim(claimA, gpu0)
	f := newFixture(t, c)
	if _, err := f.plugin.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	blockingRefresh(f, entered, release)
	go func() { _, _ = f.create(pod(podB), vgpuContainer("stuck", pod(podB), "app", c, false)) }()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := f.plugin.inflight.drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("drain with a stuck request: %v, want the deadline", err)
	}
}

// TestCreateContainerFromAReplacedSession: a CreateContainer that began before a newer
// Synchronize (it came over a connection the runtime has since dropped) adds nothing: the
// runtime no longer waits for it, and its entry would block the claim's results for others.
func TestCreateContainerFromAReplacedSession(t *testing.T) {
	c := testClaim(claimA, gpu0)
	f := newFixture(t, c)
	if _, err := f.plugin.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	blockingRefresh(f, entered, release)
	errc := make(chan error, 1)
	go func() {
		_, err := f.create(pod(podB), vgpuContainer("old-session", pod(podB), "app", c, false))
		errc <- err
	}()
	<-entered
	// The runtime dropped that connection; the plugin reconnected and was synchronized.
	if _, err := f.plugin.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-errc; !errors.Is(err, ErrStaleSession) {
		t.Errorf("CreateContainer of the replaced session: %v, want ErrStaleSession", err)
	}
	if f.plugin.Cache().Len() != 0 || f.anyContainerDirs() {
		t.Error("the replaced session's container left a cache entry or a directory")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}
