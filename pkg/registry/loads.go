package registry

import (
	"container/list"
	"slices"
	"sync"
)

// phase is what a caller's connection counts against.
type phase int

const (
	phaseReading  phase = iota // still reading its frame (MaxOpenConnsPerCaller, MaxOpenConnsPerPod)
	phaseInFlight              // a whole request being handled (MaxRequestsPerCaller, MaxRequestsPerPod)
	phaseWaiting               // a whole request waiting for an in-flight slot of its caller or pod
	numPhases
)

// limits are the bounds loads keeps: per caller (container) and per pod, on connections
// reading their frame, on requests in flight and on requests waiting for an in-flight slot.
type limits struct {
	readingPerCaller, readingPerPod   int
	inFlightPerCaller, inFlightPerPod int
	waitingPerCaller, waitingPerPod   int
}

// Who is over a bound, for the BUSY message.
const (
	overCaller = "this container"
	overPod    = "this pod"
)

// loads counts, per caller key and per pod key (contract §5, "Bounds"), the connections in
// each phase. Each pod also keeps its connections still reading their frame in the order
// they were accepted, so that the node-wide bound on open connections can shed the newest
// one of the pod that holds the most (shedFor), and its requests waiting for an in-flight
// slot, oldest first. A key is forgotten when its counts drop to zero, so the maps hold only
// callers and pods with connections open.
type loads struct {
	mu      sync.Mutex
	limits  limits
	callers map[string]*[numPhases]int
	pods    map[string]*podLoad
}

type podLoad struct {
	n       [numPhases]int
	reading list.List         // of *connState: those that can still be shed, by accept order
	waiters []*waitingRequest // oldest first
}

// waitingRequest is a request waiting for an in-flight slot; its turn arrives on turn.
type waitingRequest struct {
	caller string
	turn   chan struct{}
}

func newLoads(l limits) *loads {
	return &loads{limits: l, callers: map[string]*[numPhases]int{}, pods: map[string]*podLoad{}}
}

// of returns who's counts and its pod's, creating them. Called under mu.
func (l *loads) of(who caller) (*[numPhases]int, *podLoad) {
	c := l.callers[who.key]
	if c == nil {
		c = &[numPhases]int{}
		l.callers[who.key] = c
	}
	p := l.pods[who.pod]
	if p == nil {
		p = &podLoad{}
		l.pods[who.pod] = p
	}
	return c, p
}

// forgetIdle drops who's counts and its pod's where they are all zero. Called under mu.
func (l *loads) forgetIdle(who caller, c *[numPhases]int, p *podLoad) {
	if *c == [numPhases]int{} {
		delete(l.callers, who.key)
	}
	if p.n == [numPhases]int{} {
		delete(l.pods, who.pod)
	}
}

// enterReading counts cs, a connection of who, as reading its frame, unless who's container
// or pod is at its bound there; then it returns which of them, and counts nothing.
func (l *loads) enterReading(who caller, cs *connState) (over string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, p := l.of(who)
	switch {
	case c[phaseReading] >= l.limits.readingPerCaller:
		over = overCaller
	case p.n[phaseReading] >= l.limits.readingPerPod:
		over = overPod
	default:
		c[phaseReading]++
		p.n[phaseReading]++
		// In accept order: connections are identified concurrently, so one accepted
		// later may get here first.
		at := p.reading.Back()
		for at != nil && at.Value.(*connState).seq > cs.seq {
			at = at.Prev()
		}
		if at == nil {
			cs.sheddable = p.reading.PushFront(cs)
		} else {
			cs.sheddable = p.reading.InsertAfter(cs, at)
		}
		return "", true
	}
	l.forgetIdle(who, c, p)
	return over, false
}

// leaveReading undoes enterReading.
func (l *loads) leaveReading(who caller, cs *connState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, p := l.callers[who.key], l.pods[who.pod]
	if c == nil || p == nil {
		return
	}
	c[phaseReading]--
	p.n[phaseReading]--
	if cs.sheddable != nil {
		p.reading.Remove(cs.sheddable)
		cs.sheddable = nil
	}
	l.forgetIdle(who, c, p)
}

// shedFor picks the connection to shed so that who, a newcomer over the node-wide bound on
// open connections, can be served in its place: the newest connection still reading its
// frame of the pod that holds the most of them (on a tie, the pod with the newest one), when
// that pod holds at least two more than who's pod — after the swap the newcomer's pod then
// holds no more than the other, so two pods cannot keep shedding each other's connections —
// and who itself is within its container's and pod's bounds. The one picked is marked shed
// and no longer counts as sheddable; nil when there is none.
func (l *loads) shedFor(who caller) *connState {
	l.mu.Lock()
	defer l.mu.Unlock()
	mine := 0
	if p := l.pods[who.pod]; p != nil {
		if p.n[phaseReading] >= l.limits.readingPerPod {
			return nil
		}
		mine = p.reading.Len()
	}
	if c := l.callers[who.key]; c != nil && c[phaseReading] >= l.limits.readingPerCaller {
		return nil
	}
	var most *podLoad
	for _, p := range l.pods {
		if p.reading.Len() == 0 {
			continue
		}
		if most == nil || p.reading.Len() > most.reading.Len() ||
			p.reading.Len() == most.reading.Len() && p.reading.Back().Value.(*connState).seq > most.reading.Back().Value.(*connState).seq {
			most = p
		}
	}
	if most == nil || most.reading.Len() < mine+2 {
		return nil
	}
	victim := most.reading.Remove(most.reading.Back()).(*connState)
	victim.sheddable = nil
	victim.shed.Store(true)
	return victim
}

// room reports whether who's container and pod each have an in-flight slot free.
func (l *loads) room(c *[numPhases]int, p *podLoad) bool {
	return c[phaseInFlight] < l.limits.inFlightPerCaller && p.n[phaseInFlight] < l.limits.inFlightPerPod
}

// enterInFlight counts one more request of who in flight. While who's container or pod has
// its bound in flight, it waits for a slot — in its pod's order, at most waitingPerCaller
// requests of a container and waitingPerPod of a pod, each until done is closed — instead of
// turning the request away: a container whose processes register all at once (64 at a time),
// or a pod whose containers do, then waits for its own slots rather than for a BUSY's
// retry_after_ms. It returns false, counting nothing, when the queue is full or done was
// closed first, and then which of the two bounds held it back.
func (l *loads) enterInFlight(who caller, done <-chan struct{}) (over string, ok bool) {
	l.mu.Lock()
	c, p := l.of(who)
	if l.room(c, p) {
		c[phaseInFlight]++
		p.n[phaseInFlight]++
		l.mu.Unlock()
		return "", true
	}
	over = l.overInFlight(c)
	if c[phaseWaiting] >= l.limits.waitingPerCaller || p.n[phaseWaiting] >= l.limits.waitingPerPod {
		l.forgetIdle(who, c, p)
		l.mu.Unlock()
		return over, false
	}
	w := &waitingRequest{caller: who.key, turn: make(chan struct{}, 1)}
	c[phaseWaiting]++
	p.n[phaseWaiting]++
	p.waiters = append(p.waiters, w)
	l.mu.Unlock()
	select {
	case <-w.turn: // handOver moved this request from waiting to in flight
		return "", true
	case <-done:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-w.turn: // handed a slot just now: give it to the next one
		c[phaseInFlight]--
		p.n[phaseInFlight]--
		l.handOver(p)
	default:
		p.waiters = slices.DeleteFunc(p.waiters, func(o *waitingRequest) bool { return o == w })
		c[phaseWaiting]--
		p.n[phaseWaiting]--
		over = l.overInFlight(c)
	}
	l.forgetIdle(who, c, p)
	return over, false
}

// overInFlight names the bound that holds a request of the caller with counts c back.
func (l *loads) overInFlight(c *[numPhases]int) string {
	if c[phaseInFlight] >= l.limits.inFlightPerCaller {
		return overCaller
	}
	return overPod
}

// leaveInFlight undoes an enterInFlight that returned true.
func (l *loads) leaveInFlight(who caller) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, p := l.callers[who.key], l.pods[who.pod]
	if c == nil || p == nil {
		return
	}
	c[phaseInFlight]--
	p.n[phaseInFlight]--
	l.handOver(p)
	l.forgetIdle(who, c, p)
}

// handOver gives the pod's free in-flight slots to its oldest waiting requests whose
// container has a slot free too. Called under mu.
func (l *loads) handOver(p *podLoad) {
	for i := 0; i < len(p.waiters) && p.n[phaseInFlight] < l.limits.inFlightPerPod; {
		w := p.waiters[i]
		c := l.callers[w.caller]
		if c[phaseInFlight] >= l.limits.inFlightPerCaller {
			i++
			continue
		}
		p.waiters = slices.Delete(p.waiters, i, i+1)
		c[phaseWaiting]--
		p.n[phaseWaiting]--
		c[phaseInFlight]++
		p.n[phaseInFlight]++
		w.turn <- struct{}{}
	}
}
