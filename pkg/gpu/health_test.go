package gpu

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"
)

// fastHealth keeps the watcher's waits short so that tests end quickly; nothing asserts them.
var fastHealth = healthTimings{wait: 10 * time.Millisecond, retryMin: time.Millisecond, retryMax: 5 * time.Millisecond, xidQuiet: time.Hour}

// watch runs src.WatchHealth until the test ends and checks that it returns nil on cancel.
func watch(t *testing.T, src Source) <-chan HealthEvent {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	events := make(chan HealthEvent)
	done := make(chan error, 1)
	go func() { done <- src.WatchHealth(ctx, events) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchHealth returned %v after cancel, want nil", err)
		}
	})
	return events
}

// next reads one event; the deadline only keeps a broken test from hanging.
func next(t *testing.T, events <-chan HealthEvent) HealthEvent {
	t.Helper()
	select {
	case ev := <-events:
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no health event arrived")
		return HealthEvent{}
	}
}

func newWatchedSimulated(t *testing.T, count int) *Simulated {
	t.Helper()
	sim := newTestSimulated(t, "dgx-h200", count)
	sim.src.health = fastHealth
	return sim
}

func TestSimulatedHealth(t *testing.T) {
	sim := newWatchedSimulated(t, 4)
	uuid := func(i int) string { return sim.visible[i].UUID }
	events := watch(t, sim)
	// Steps run in order through one event queue, so an event that should not have been sent
	// shows up in place of the next expected one.
	steps := []struct {
		name    string
		gpu     int
		healthy bool
		xid     uint64
		want    *HealthEvent
	}{
		{"fatal XID", 0, false, 79, &HealthEvent{Healthy: false, Fatal: true, Reason: "XID 79 (GPU has fallen off the bus)"}},
		{"non-fatal XID", 1, false, 94, &HealthEvent{Healthy: false, Fatal: false, Reason: "XID 94"}},
		{"application XID is ignored", 2, false, 13, nil},
		{"same fault again is no change", 1, false, 94, nil},
		{"non-fatal XID on a fatal GPU is no change", 0, false, 63, nil},
		{"escalation to fatal", 1, false, 48, &HealthEvent{Healthy: false, Fatal: true, Reason: "XID 48 (double-bit ECC error)"}},
		{"healthy again", 0, true, 0, &HealthEvent{Healthy: true, Reason: "marked healthy"}},
		{"healthy GPU marked healthy is no change", 2, true, 0, nil},
		{"fault after recovery", 0, false, 31, nil},
		{"new fault after recovery", 0, false, 92, &HealthEvent{Healthy: false, Reason: "XID 92"}},
		{"application XID leaves other GPUs alone", 3, false, 43, nil},
		{"sentinel", 3, false, 95, &HealthEvent{Healthy: false, Fatal: true, Reason: "XID 95 (uncontained ECC error)"}},
	}
	for _, st := range steps {
		if err := sim.SetHealth(uuid(st.gpu), st.healthy, st.xid); err != nil {
			t.Fatalf("%s: SetHealth: %v", st.name, err)
		}
		if st.want == nil {
			continue
		}
		want := *st.want
		want.UUID = uuid(st.gpu)
		if got := next(t, events); got != want {
			t.Errorf("%s: got %+v, want %+v", st.name, got, want)
		}
	}
}

func TestSetHealthBeforeWatchIsHeld(t *testing.T) {
	sim := newWatchedSimulated(t, 2)
	if err := sim.SetHealth(sim.visible[1].UUID, false, 74); err != nil {
		t.Fatalf("SetHealth: %v", err)
	}
	events := watch(t, sim)
	want := HealthEvent{UUID: sim.visible[1].UUID, Fatal: true, Reason: "XID 74 (NVLink error)"}
	if got := next(t, events); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestEveryWatcherGetsEvents(t *testing.T) {
	sim := newWatchedSimulated(t, 1)
	first, second := watch(t, sim), watch(t, sim)
	// Held events go to the first registration only; this test is about live sets.
	waitForSets(t, sim, 2)
	if err := sim.SetHealth(sim.visible[0].UUID, false, 79); err != nil {
		t.Fatalf("SetHealth: %v", err)
	}
	for i, events := range []<-chan HealthEvent{first, second} {
		if got := next(t, events); got.UUID != sim.visible[0].UUID || got.Healthy || !got.Fatal {
			t.Errorf("watcher %d got %+v", i, got)
		}
	}
}

// waitForSets waits until n event sets have every visible GPU registered.
func waitForSets(t *testing.T, sim *Simulated, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sim.events.mu.Lock()
		ready := 0
		for s := range sim.events.sets {
			if len(s.registered) == len(sim.visible) {
				ready++
			}
		}
		sim.events.mu.Unlock()
		if ready >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d event sets registered", ready, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestWatchHealthEndsOnCancel(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, sim *Simulated)
	}{
		{"waiting for events", func(*testing.T, *Simulated) {}},
		{"blocked sending an event nobody reads", func(t *testing.T, sim *Simulated) {
			if err := sim.SetHealth(sim.visible[0].UUID, false, 79); err != nil {
				t.Fatalf("SetHealth: %v", err)
			}
		}},
		{"no GPU supports health events", func(_ *testing.T, sim *Simulated) {
			sim.visible[0].GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypePState, nvml.SUCCESS }
		}},
		{"backing off after NVML errors", func(_ *testing.T, sim *Simulated) {
			sim.src.health.retryMin, sim.src.health.retryMax = time.Hour, time.Hour
			sim.server.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_UNKNOWN }
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sim := newWatchedSimulated(t, 1)
			tc.setup(t, sim)
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- sim.WatchHealth(ctx, make(chan HealthEvent)) }()
			time.Sleep(20 * time.Millisecond) // let it reach the state under test; not asserted
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("WatchHealth = %v, want nil", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("WatchHealth did not return after cancel")
			}
		})
	}
}

func TestWatchHealthNilChannel(t *testing.T) {
	sim := newWatchedSimulated(t, 1)
	if err := sim.WatchHealth(context.Background(), nil); err == nil {
		t.Error("WatchHealth(nil channel) = nil, want an error")
	}
}

func TestSetHealthErrors(t *testing.T) {
	sim := newWatchedSimulated(t, 2)
	hidden := simulatedUUID(testNode, "dgx-h200", 5) // exists in the profile, beyond count
	cases := []struct {
		name    string
		uuid    string
		healthy bool
		xid     uint64
		wantMsg string
	}{
		{"unknown GPU", "GPU-00000000-0000-0000-0000-000000000000", false, 79, "no such GPU"},
		{"GPU beyond count", hidden, false, 79, "no such GPU"},
		{"healthy with an XID", sim.visible[0].UUID, true, 79, "healthy takes XID 0"},
		{"unhealthy without an XID", sim.visible[0].UUID, false, 0, "needs the XID"},
	}
	for _, tc := range cases {
		err := sim.SetHealth(tc.uuid, tc.healthy, tc.xid)
		if err == nil || !strings.Contains(err.Error(), tc.wantMsg) {
			t.Errorf("%s: SetHealth = %v, want %q", tc.name, err, tc.wantMsg)
		}
	}
	if err := sim.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := sim.SetHealth(sim.visible[0].UUID, false, 79); err == nil {
		t.Error("SetHealth after Close = nil, want an error")
	}
}

// TestRegistrationFaults covers NVML's per-GPU answers at registration: a lost GPU is reported
// fatal at once, a GPU without events is skipped, and the others are still watched.
func TestRegistrationFaults(t *testing.T) {
	sim := newWatchedSimulated(t, 4)
	sim.visible[0].RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_GPU_IS_LOST }
	sim.visible[1].GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.SUCCESS }
	sim.visible[2].RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
	events := watch(t, sim)
	want := HealthEvent{UUID: sim.visible[0].UUID, Fatal: true, Reason: "GPU is lost (NVML ERROR_GPU_IS_LOST)"}
	if got := next(t, events); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if err := sim.SetHealth(sim.visible[3].UUID, false, 62); err != nil {
		t.Fatalf("SetHealth: %v", err)
	}
	if got := next(t, events); got.UUID != sim.visible[3].UUID || !got.Fatal {
		t.Errorf("got %+v, want GPU 3 fatal", got)
	}
}

// TestNVMLErrorsAreRetried injects one NVML failure at each step of the watch and checks that
// the watcher recovers on a fresh event set and still reports faults.
func TestNVMLErrorsAreRetried(t *testing.T) {
	cases := []struct {
		name   string
		inject func(sim *Simulated, fired func())
	}{
		{"event set create", func(sim *Simulated, fired func()) {
			create := sim.server.EventSetCreateFunc
			var calls int
			sim.server.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
				calls++ // only the watcher's goroutine creates sets
				if calls == 1 {
					return nil, nvml.ERROR_UNKNOWN
				}
				fired()
				return create()
			}
		}},
		{"device count", func(sim *Simulated, fired func()) {
			count := sim.server.DeviceGetCountFunc
			var calls int
			sim.server.DeviceGetCountFunc = func() (int, nvml.Return) {
				calls++ // only the watcher's goroutine counts GPUs here
				if calls == 1 {
					return 0, nvml.ERROR_UNKNOWN
				}
				fired()
				return count()
			}
		}},
		{"every registration", func(sim *Simulated, fired func()) {
			register := sim.visible[0].RegisterEventsFunc
			var calls int
			sim.visible[0].RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
				calls++
				if calls == 1 {
					return nvml.ERROR_UNKNOWN
				}
				fired()
				return register(types, set)
			}
		}},
		{"wait", func(sim *Simulated, fired func()) {
			create := sim.server.EventSetCreateFunc
			var calls int
			sim.server.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
				set, ret := create()
				calls++
				if calls == 1 {
					set.(*simEventSet).WaitFunc = func(uint32) (nvml.EventData, nvml.Return) {
						return nvml.EventData{}, nvml.ERROR_UNKNOWN
					}
				} else {
					fired() // the failed set is freed by now
				}
				return set, ret
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sim := newWatchedSimulated(t, 1)
			recovered := make(chan struct{})
			var once sync.Once
			tc.inject(sim, func() { once.Do(func() { close(recovered) }) })
			events := watch(t, sim)
			select {
			case <-recovered:
			case <-time.After(30 * time.Second):
				t.Fatal("the watcher did not retry")
			}
			if err := sim.SetHealth(sim.visible[0].UUID, false, 48); err != nil {
				t.Fatalf("SetHealth: %v", err)
			}
			if got := next(t, events); got.UUID != sim.visible[0].UUID || !got.Fatal {
				t.Errorf("got %+v, want GPU 0 fatal", got)
			}
		})
	}
}

// TestMalformedEventsAreSkipped feeds the watcher events that real NVML should never produce:
// it logs and carries on.
func TestMalformedEventsAreSkipped(t *testing.T) {
	sim := newWatchedSimulated(t, 2)
	events := watch(t, sim)
	waitForSets(t, sim, 1)
	sim.visible[1].GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	sim.events.mu.Lock()
	for s := range sim.events.sets {
		s.queue <- nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: 79}
		s.queue <- nvml.EventData{Device: sim.visible[1], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	}
	sim.events.mu.Unlock()
	if err := sim.SetHealth(sim.visible[0].UUID, false, 94); err != nil {
		t.Fatalf("SetHealth: %v", err)
	}
	if got := next(t, events); got.UUID != sim.visible[0].UUID {
		t.Errorf("got %+v, want the event of GPU 0 only", got)
	}
}

// TestSimulatedQueuesAreBounded checks that SetHealth fails, rather than blocks or grows without
// end, when no one reads the events.
func TestSimulatedQueuesAreBounded(t *testing.T) {
	t.Run("held before any watcher", func(t *testing.T) {
		sim := newWatchedSimulated(t, 1)
		for i := range simEventQueueLen {
			if err := sim.SetHealth(sim.visible[0].UUID, false, uint64(100+i)); err != nil {
				t.Fatalf("SetHealth %d: %v", i, err)
			}
		}
		if err := sim.SetHealth(sim.visible[0].UUID, false, 79); err == nil || !strings.Contains(err.Error(), "already held") {
			t.Errorf("SetHealth over the bound = %v, want an error", err)
		}
	})
	t.Run("queued for a watcher that does not read", func(t *testing.T) {
		sim := newWatchedSimulated(t, 1)
		watch(t, sim) // never read
		waitForSets(t, sim, 1)
		var err error
		for i := 0; i <= simEventQueueLen+1 && err == nil; i++ {
			err = sim.SetHealth(sim.visible[0].UUID, false, 79)
		}
		if err == nil || !strings.Contains(err.Error(), "event queue full") {
			t.Errorf("SetHealth over the bound = %v, want an error", err)
		}
	})
}

// TestUnknownXIDDecays: a tenant's program raises an XID outside both lists with NVML's recovery
// action at none (nothing will ever say the GPU recovered). The GPU is unhealthy, but healthy
// again once the quiet period passes without another; a repeat starts the period over and is
// counted. A GPU whose recovery action asks for something does not decay, nor a fatal one.
func TestUnknownXIDDecays(t *testing.T) {
	const quiet = 300 * time.Millisecond
	sim := newTestSimulated(t, "dgx-h200", 3)
	sim.src.health = fastHealth
	sim.src.health.xidQuiet = quiet
	uuid := func(i int) string { return sim.visible[i].UUID }
	events := watch(t, sim)

	start := time.Now()
	if err := sim.SetHealth(uuid(0), false, 92); err != nil {
		t.Fatal(err)
	}
	if got := next(t, events); got.UUID != uuid(0) || got.Healthy || got.Fatal || got.Reason != "XID 92" {
		t.Fatalf("after XID 92: %+v, want unhealthy, not fatal", got)
	}
	time.Sleep(quiet / 2)
	if err := sim.SetHealth(uuid(0), false, 92); err != nil { // the same again: the period starts over
		t.Fatal(err)
	}
	repeated := time.Now()
	// GPU 1 needs a reset (recovery action), then raises the same XID: it must not decay.
	if err := sim.SetRecoveryAction(uuid(1), nvml.GPU_RECOVERY_ACTION_DRAIN_P2P); err != nil {
		t.Fatal(err)
	}
	if got := next(t, events); got.UUID != uuid(1) || got.Healthy {
		t.Fatalf("after a recovery action: %+v, want GPU 1 unhealthy", got)
	}
	if err := sim.SetHealth(uuid(1), false, 92); err != nil {
		t.Fatal(err)
	}
	got := next(t, events)
	if got.UUID != uuid(0) || !got.Healthy || !strings.Contains(got.Reason, "XID 92 (1 repeats)") {
		t.Fatalf("decay: %+v, want GPU 0 healthy again, naming the XID and its one repeat", got)
	}
	if since := time.Since(repeated); since < quiet {
		t.Errorf("GPU 0 healthy %v after the repeat, before its quiet period of %v", since, quiet)
	}
	if since := time.Since(start); since < quiet+quiet/2 {
		t.Errorf("GPU 0 healthy %v after the first XID: the repeat did not start the period over", since)
	}
	// Nothing else comes: GPU 1 stays unhealthy past the quiet period. A sentinel on GPU 2
	// shows up in place of any event that should not have been sent.
	time.Sleep(2 * quiet)
	if err := sim.SetHealth(uuid(2), false, 79); err != nil {
		t.Fatal(err)
	}
	if got := next(t, events); got.UUID != uuid(2) || !got.Fatal {
		t.Errorf("got %+v, want only the sentinel (GPU 1 must not decay)", got)
	}
}
