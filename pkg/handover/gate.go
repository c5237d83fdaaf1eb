package handover

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Decision is what a Gate says about one call.
type Decision int

const (
	// Local: this instance owns the node and serves the call itself.
	Local Decision = iota
	// Pass: another instance owns the node; this one must not change shared state for the
	// call (an NRI CreateContainer answers without an adjustment, a kubelet call is forwarded).
	Pass
)

func (d Decision) String() string {
	if d == Local {
		return "local"
	}
	return "pass"
}

// ErrUndecided is Enter's error when ctx ends while the call is held by a handover.
var ErrUndecided = errors.New("the node's vGPU plugin is handing over to its next version and did not decide in time; the kubelet retries")

type gateState int

const (
	owning gateState = iota
	fencing
	observing
)

// Gate holds one kind of call (the kubelet's Prepare/Unprepare, NRI's CreateContainer) while a
// handover is being decided, and counts the calls this instance serves, so that the fence can
// wait for them (contract §14). Its zero value is not usable: NewGate.
type Gate struct {
	mu       sync.Mutex
	state    gateState
	inflight int
	// changed is closed, and replaced, whenever the state changes or inflight drops to 0.
	changed chan struct{}
	// onHeld is told how long each held call waited (nil: not told).
	onHeld func(waited time.Duration)
	// heldTotal counts the calls that had to wait, ever.
	heldTotal int64
}

// NewGate returns a gate that passes every call (an instance starts as an observer) and reports
// each held call's wait to onHeld (may be nil).
func NewGate(onHeld func(waited time.Duration)) *Gate {
	return &Gate{state: observing, changed: make(chan struct{}), onHeld: onHeld}
}

func (g *Gate) changedLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// Enter decides a call. Local calls must call done when they have finished; Pass calls get a
// done that does nothing. While the gate is closed (Close) the call waits for the outcome, at
// most until ctx ends (ErrUndecided).
func (g *Gate) Enter(ctx context.Context) (d Decision, done func(), err error) {
	var heldSince time.Time
	for {
		g.mu.Lock()
		switch g.state {
		case owning:
			g.inflight++
			g.mu.Unlock()
			g.held(heldSince)
			return Local, g.leave, nil
		case observing:
			g.mu.Unlock()
			g.held(heldSince)
			return Pass, func() {}, nil
		}
		changed := g.changed
		if heldSince.IsZero() {
			heldSince = time.Now()
			g.heldTotal++
		}
		g.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			g.held(heldSince)
			return Pass, func() {}, ErrUndecided
		}
	}
}

func (g *Gate) held(since time.Time) {
	if !since.IsZero() && g.onHeld != nil {
		g.onHeld(time.Since(since))
	}
}

func (g *Gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	if g.inflight == 0 {
		g.changedLocked()
	}
}

// Close holds new calls and waits until the calls in flight have finished. If ctx ends first
// the gate stays closed and ctx's error is returned: the caller calls the handover off (Own).
func (g *Gate) Close(ctx context.Context) error {
	g.mu.Lock()
	if g.state != fencing {
		g.state = fencing
		g.changedLocked()
	}
	g.mu.Unlock()
	for {
		g.mu.Lock()
		n, changed := g.inflight, g.changed
		g.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// Own opens the gate for this instance: held and new calls are served here.
func (g *Gate) Own() { g.set(owning) }

// Observe opens the gate for the owner elsewhere: held and new calls pass.
func (g *Gate) Observe() { g.set(observing) }

func (g *Gate) set(s gateState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != s {
		g.state = s
		g.changedLocked()
	}
}

// HeldTotal is the number of calls that have had to wait so far.
func (g *Gate) HeldTotal() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.heldTotal
}

// Observing reports whether calls pass to another owner (neither served here nor held).
func (g *Gate) Observing() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == observing
}

// Owning reports whether calls are served here now (not held, not passed).
func (g *Gate) Owning() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == owning
}
