package gpu

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// simEventQueueLen bounds the events one simulated event set, and the held events, may queue.
const simEventQueueLen = 256

// errSimulatedClosed is returned for events injected after Close.
var errSimulatedClosed = errors.New("simulated GPU source closed")

// simEventHub plays NVML's event machinery for the simulated source: the shared watcher creates
// event sets and registers GPUs on them through the mock's EventSetCreate and RegisterEvents,
// and SetHealth's events come out of the sets' Wait like real ones.
type simEventHub struct {
	mu     sync.Mutex
	closed bool
	sets   map[*simEventSet]struct{}
	// held are events for GPUs that no live set has registered yet, oldest first.
	held []nvml.EventData
}

// simEventSet is one event set: go-nvml's EventSet mock with Wait and Free filled in.
type simEventSet struct {
	mock.EventSet
	queue chan nvml.EventData
	done  chan struct{} // closed by Free or by the hub's close
	// registered maps each GPU on this set to its event mask; guarded by the hub's mu.
	registered map[nvml.Device]uint64
}

func newSimEventHub() *simEventHub {
	return &simEventHub{sets: map[*simEventSet]struct{}{}}
}

// create is the mock's EventSetCreate.
func (h *simEventHub) create() (nvml.EventSet, nvml.Return) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nvml.ERROR_UNINITIALIZED
	}
	set := &simEventSet{
		queue:      make(chan nvml.EventData, simEventQueueLen),
		done:       make(chan struct{}),
		registered: map[nvml.Device]uint64{},
	}
	set.WaitFunc = set.wait
	set.FreeFunc = func() nvml.Return { return h.free(set) }
	h.sets[set] = struct{}{}
	return set, nvml.SUCCESS
}

// register is the mock's RegisterEvents for dev; it hands over the events held for dev.
func (h *simEventHub) register(dev nvml.Device, types uint64, set nvml.EventSet) nvml.Return {
	s, ok := set.(*simEventSet)
	if !ok {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, live := h.sets[s]; !live {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	s.registered[dev] |= types
	kept := h.held[:0]
	for _, ev := range h.held {
		if ev.Device == dev && accepts(s.registered[dev], ev) && trySend(s.queue, ev) {
			continue
		}
		kept = append(kept, ev)
	}
	h.held = kept
	return nvml.SUCCESS
}

// deliver queues ev on every live set that registered dev for its type, or holds it when no
// set has registered dev at all.
func (h *simEventHub) deliver(dev nvml.Device, ev nvml.EventData) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return errSimulatedClosed
	}
	registered := false
	for s := range h.sets {
		mask, ok := s.registered[dev]
		if !ok {
			continue
		}
		registered = true
		if accepts(mask, ev) && !trySend(s.queue, ev) {
			return fmt.Errorf("event queue full (%d events not yet read)", simEventQueueLen)
		}
	}
	if registered {
		return nil
	}
	if len(h.held) >= simEventQueueLen {
		return fmt.Errorf("%d events already held for GPUs that no health watcher has registered", len(h.held))
	}
	h.held = append(h.held, ev)
	return nil
}

// free is the mock's Free: the set stops receiving, and events still queued on it are dropped,
// as NVML drops them.
func (h *simEventHub) free(s *simEventSet) nvml.Return {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, live := h.sets[s]; !live {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	delete(h.sets, s)
	close(s.done)
	return nvml.SUCCESS
}

// close ends every set's waits; later calls into the hub fail.
func (h *simEventHub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	for s := range h.sets {
		close(s.done)
		delete(h.sets, s)
	}
}

// wait is the mock's Wait: the next queued event, or ERROR_TIMEOUT after timeoutMs.
func (s *simEventSet) wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	timer := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer timer.Stop()
	select {
	case ev := <-s.queue:
		return ev, nvml.SUCCESS
	case <-s.done:
		return nvml.EventData{}, nvml.ERROR_UNINITIALIZED
	case <-timer.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

// accepts says whether a registration with mask receives ev. Recoveries reach every
// registration: they are the simulated source's own, not an NVML type one could register.
func accepts(mask uint64, ev nvml.EventData) bool {
	return ev.EventType == eventTypeSimulatedRecovery || mask&ev.EventType != 0
}

// trySend queues ev without blocking; false when the queue is full.
func trySend(queue chan nvml.EventData, ev nvml.EventData) bool {
	select {
	case queue <- ev:
		return true
	default:
		return false
	}
}
