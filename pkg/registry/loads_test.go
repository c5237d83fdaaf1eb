package registry

import (
	"testing"
	"time"
)

// TestInFlightQueue: a request over its caller's in-flight bound waits for one of its caller's
// slots, oldest first, while no more than the queue bound wait; over that it is turned away at
// once, and so is a waiting one whose done closes. Another caller is never held up.
func TestInFlightQueue(t *testing.T) {
	l := newLoads(limits{inFlightPerCaller: 1, inFlightPerPod: 10, waitingPerCaller: 2, waitingPerPod: 10})
	a, other := caller{key: "a", pod: "p"}, caller{key: "other", pod: "q"}
	never := make(chan struct{})
	if _, ok := l.enterInFlight(a, never); !ok {
		t.Fatal("first request of a not admitted")
	}
	admitted := make(chan string, 2)
	for _, name := range []string{"b1", "b2"} {
		go func() {
			if _, ok := l.enterInFlight(a, never); ok {
				admitted <- name
			}
		}()
		waitWaiting(t, l, a, map[string]int{"b1": 1, "b2": 2}[name])
	}
	if over, ok := l.enterInFlight(a, never); ok || over != overCaller {
		t.Errorf("a request over the caller's queue bound: admitted %v, over %q", ok, over)
	}
	if _, ok := l.enterInFlight(other, never); !ok {
		t.Error("another caller was held up by a's queue")
	}
	l.leaveInFlight(other)
	select {
	case name := <-admitted:
		t.Fatalf("%s admitted while the slot is held", name)
	case <-time.After(20 * time.Millisecond):
	}
	l.leaveInFlight(a)
	if got := <-admitted; got != "b1" {
		t.Errorf("%s admitted first, want the oldest waiting request b1", got)
	}
	l.leaveInFlight(a)
	if got := <-admitted; got != "b2" {
		t.Errorf("%s admitted second, want b2", got)
	}
	l.leaveInFlight(a)
	assertIdle(t, l)

	// A waiting request whose done closes is turned away and leaves no count behind.
	if _, ok := l.enterInFlight(a, never); !ok {
		t.Fatal("request not admitted")
	}
	done := make(chan struct{})
	result := make(chan bool)
	go func() { _, ok := l.enterInFlight(a, done); result <- ok }()
	waitWaiting(t, l, a, 1)
	close(done)
	if <-result {
		t.Error("a request whose wait ended was admitted")
	}
	l.leaveInFlight(a)
	assertIdle(t, l)
}

// TestPodInFlightQueue: the containers of one pod share its in-flight bound. Over it a request
// waits although its own container has room, and gets the pod's next free slot in the pod's
// order — skipping a waiting request whose container is still at its own bound; over the
// pod's queue bound it is turned away. Another pod is never held up.
func TestPodInFlightQueue(t *testing.T) {
	l := newLoads(limits{inFlightPerCaller: 1, inFlightPerPod: 2, waitingPerCaller: 5, waitingPerPod: 2})
	a, b, c := caller{key: "a", pod: "p"}, caller{key: "b", pod: "p"}, caller{key: "c", pod: "p"}
	never := make(chan struct{})
	for _, who := range []caller{a, b} {
		if _, ok := l.enterInFlight(who, never); !ok {
			t.Fatalf("first request of %s not admitted", who.key)
		}
	}
	admitted := make(chan string, 2)
	for i, who := range []caller{a, c} { // a waits for its own slot, c for the pod's
		go func() {
			if _, ok := l.enterInFlight(who, never); ok {
				admitted <- who.key
			}
		}()
		waitPodWaiting(t, l, "p", i+1)
	}
	if over, ok := l.enterInFlight(caller{key: "e", pod: "p"}, never); ok || over != overPod {
		t.Errorf("a request over the pod's queue bound: admitted %v, over %q", ok, over)
	}
	if _, ok := l.enterInFlight(caller{key: "d", pod: "q"}, never); !ok {
		t.Error("another pod was held up by p's bound")
	}
	l.leaveInFlight(b) // a's container is still full: the slot goes to c, behind a in the queue
	if got := <-admitted; got != "c" {
		t.Errorf("%s admitted, want c (a's container is at its bound)", got)
	}
	l.leaveInFlight(a)
	if got := <-admitted; got != "a" {
		t.Errorf("%s admitted, want a", got)
	}
	l.leaveInFlight(a)
	l.leaveInFlight(c)
	l.leaveInFlight(caller{key: "d", pod: "q"})
	assertIdle(t, l)
}

// TestShedFor: a newcomer over the node's bound sheds the newest sheddable connection of the
// pod holding the most, and only when that pod holds at least two more than the newcomer's;
// never one of a newcomer over its own bounds.
func TestShedFor(t *testing.T) {
	l := newLoads(limits{readingPerCaller: 10, readingPerPod: 4})
	seq := uint64(0)
	open := func(who caller) *connState {
		seq++
		cs := &connState{seq: seq}
		if _, ok := l.enterReading(who, cs); !ok {
			t.Fatalf("connection of %s refused", who.key)
		}
		return cs
	}
	heavy := caller{key: "h1", pod: "heavy"}
	h := []*connState{open(heavy), open(heavy), open(caller{key: "h2", pod: "heavy"})}
	light := caller{key: "l", pod: "light"}
	open(light)
	v := l.shedFor(light) // 1 against 3: after the swap 2 against 2
	if v != h[2] {
		t.Fatalf("shed %v for a pod holding 1 against one holding 3, want the heavy pod's newest %d", v, h[2].seq)
	}
	if !v.shed.Load() {
		t.Error("the shed connection is not marked shed")
	}
	l.leaveReading(caller{key: "h2", pod: "heavy"}, h[2])
	if v := l.shedFor(light); v != nil {
		t.Errorf("shed %d for a pod holding 1 against one holding 2", v.seq)
	}
	if v := l.shedFor(heavy); v != nil {
		t.Errorf("shed %d for the pod holding the most", v.seq)
	}
	l2 := open(light)
	if v := l.shedFor(caller{key: "n", pod: "new"}); v != l2 { // a tie: the pod with the newest
		t.Errorf("shed %v for a new pod, want the light pod's newest %d", v, l2.seq)
	}
	l.leaveReading(light, l2)
	full := caller{key: "f", pod: "full"}
	var f []*connState
	for range 4 {
		f = append(f, open(full))
	}
	if v := l.shedFor(full); v != nil {
		t.Errorf("shed %d for a pod at its own bound", v.seq)
	}
	if v := l.shedFor(light); v != f[3] {
		t.Errorf("shed %v, want the full pod's newest %d", v, f[3].seq)
	}

	// Newest by accept order, not by the order connections were identified in.
	l = newLoads(limits{readingPerCaller: 10, readingPerPod: 10})
	late := caller{key: "late", pod: "late"}
	newest, older := &connState{seq: 20}, &connState{seq: 19}
	for _, cs := range []*connState{newest, older, {seq: 18}} {
		if _, ok := l.enterReading(late, cs); !ok {
			t.Fatalf("connection %d refused", cs.seq)
		}
	}
	if v := l.shedFor(light); v != newest {
		t.Errorf("shed %v, want the one accepted last (%d), identified before the others", v, newest.seq)
	}
	if v := l.shedFor(light); v != older {
		t.Errorf("shed %v next, want %d", v, older.seq)
	}
}

func assertIdle(t *testing.T, l *loads) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.callers) != 0 || len(l.pods) != 0 {
		t.Errorf("loads left: %d callers, %d pods", len(l.callers), len(l.pods))
	}
}

func waitWaiting(t *testing.T, l *loads, who caller, n int) {
	t.Helper()
	waitCount(t, l, func() int {
		if c := l.callers[who.key]; c != nil {
			return c[phaseWaiting]
		}
		return 0
	}, who.key, n)
}

func waitPodWaiting(t *testing.T, l *loads, pod string, n int) {
	t.Helper()
	waitCount(t, l, func() int {
		if p := l.pods[pod]; p != nil {
			return p.n[phaseWaiting]
		}
		return 0
	}, "pod "+pod, n)
}

func waitCount(t *testing.T, l *loads, count func() int, what string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		got := count()
		l.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests of %s waiting, want %d", got, what, n)
		}
		time.Sleep(time.Millisecond)
	}
}
