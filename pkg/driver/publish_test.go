package driver

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// flakyPublisher fails its first failures calls, then keeps what it is given.
type flakyPublisher struct {
	mu       sync.Mutex
	failures int
	calls    int
	last     *resourceslice.DriverResources
	changed  chan struct{} // closed and replaced on every call
}

func newFlakyPublisher(failures int) *flakyPublisher {
	return &flakyPublisher{failures: failures, changed: make(chan struct{})}
}

func (p *flakyPublisher) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	close(p.changed)
	p.changed = make(chan struct{})
	if p.calls <= p.failures {
		return errors.New("the API server is not there")
	}
	p.last = &res
	return nil
}

// waitFor waits until cond holds for the publisher's state; it fails the test after 10 s.
func (p *flakyPublisher) waitFor(t *testing.T, what string, cond func(calls int, last *resourceslice.DriverResources) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		p.mu.Lock()
		ok, changed := cond(p.calls, p.last), p.changed
		p.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func taints(res *resourceslice.DriverResources, device int) int {
	if res == nil {
		return -1
	}
	return len(res.Pools["node-1"].Slices[0].Devices[device].Taints)
}

// TestPublishRetriesUntilItSucceeds: a republish after a health change that fails is retried
// with backoff until the helper takes the slice — with the taint, and later without it.
func TestPublishRetriesUntilItSucceeds(t *testing.T) {
	d := newTestDriver(t, func(c *Config, _ *Deps) {
		c.Publish = PublishTiming{RetryMin: time.Millisecond, RetryMax: 4 * time.Millisecond, Resync: time.Hour}
	})
	pub := newFlakyPublisher(0)
	events := make(chan gpu.HealthEvent)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	d.Start(ctx, pub, events)
	pub.waitFor(t, "the first publish", func(_ int, last *resourceslice.DriverResources) bool { return taints(last, 1) == 0 })

	pub.mu.Lock()
	pub.failures = pub.calls + 3 // the next three attempts fail
	pub.mu.Unlock()
	events <- gpu.HealthEvent{UUID: uuidGPU1, Healthy: false, Reason: "XID 92"}
	pub.waitFor(t, "the taint to be published", func(_ int, last *resourceslice.DriverResources) bool { return taints(last, 1) == 1 })
	if got := d.metric(t, "vgpu_dra_slice_publish_errors_total", "", ""); got != 3 {
		t.Errorf("slice_publish_errors_total = %v, want the 3 failed attempts", got)
	}

	pub.mu.Lock()
	pub.failures = pub.calls + 2
	pub.mu.Unlock()
	events <- gpu.HealthEvent{UUID: uuidGPU1, Healthy: true, Reason: "recovered"}
	pub.waitFor(t, "the taint to be lifted", func(_ int, last *resourceslice.DriverResources) bool { return taints(last, 1) == 0 })
}

// TestPublishResync: the current slice is handed to the helper again every Resync, so that a
// write the helper's own retries have backed off from is tried again soon.
func TestPublishResync(t *testing.T) {
	d := newTestDriver(t, func(c *Config, _ *Deps) { c.Publish = PublishTiming{Resync: 5 * time.Millisecond} })
	pub := newFlakyPublisher(0)
	d.Start(t.Context(), pub, nil)
	pub.waitFor(t, "three hand-overs without any change", func(calls int, _ *resourceslice.DriverResources) bool { return calls >= 3 })
}
