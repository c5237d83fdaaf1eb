package registry

import (
	"testing"
	"time"
)

// TestInFlightQueue: a request over its caller's in-flight bound waits for one of its caller's
// slots, oldest first, while no more than the queue bound wait; over that it is turned away at
// once, and so is a waiting one whose done closes. Another caller is never held up.
func TestInFlightQueue(t *testing.T) {
	l := newCallerLoads()
	never := make(chan struct{})
	if !l.enterInFlight("a", 1, 2, never) {
		t.Fatal("first request of a not admitted")
	}
	admitted := make(chan string, 2)
	for _, name := range []string{"b1", "b2"} {
		go func() {
			if l.enterInFlight("a", 1, 2, never) {
				admitted <- name
			}
		}()
		waitWaiting(t, l, "a", map[string]int{"b1": 1, "b2": 2}[name])
	}
	if l.enterInFlight("a", 1, 2, never) {
		t.Error("a request over the caller's queue bound was admitted")
	}
	if !l.enterInFlight("other", 1, 2, never) {
		t.Error("another caller was held up by a's queue")
	}
	l.leave("other", phaseInFlight)
	select {
	case name := <-admitted:
		t.Fatalf("%s admitted while the slot is held", name)
	case <-time.After(20 * time.Millisecond):
	}
	l.leave("a", phaseInFlight)
	if got := <-admitted; got != "b1" {
		t.Errorf("%s admitted first, want the oldest waiting request b1", got)
	}
	l.leave("a", phaseInFlight)
	if got := <-admitted; got != "b2" {
		t.Errorf("%s admitted second, want b2", got)
	}
	l.leave("a", phaseInFlight)
	if len(l.m) != 0 {
		t.Errorf("loads left: %+v", l.m["a"])
	}

	// A waiting request whose done closes is turned away and leaves no count behind.
	if !l.enterInFlight("a", 1, 2, never) {
		t.Fatal("request not admitted")
	}
	done := make(chan struct{})
	result := make(chan bool)
	go func() { result <- l.enterInFlight("a", 1, 2, done) }()
	waitWaiting(t, l, "a", 1)
	close(done)
	if <-result {
		t.Error("a request whose wait ended was admitted")
	}
	l.leave("a", phaseInFlight)
	if len(l.m) != 0 {
		t.Errorf("loads left after a given-up wait: %+v", l.m["a"])
	}
}

func waitWaiting(t *testing.T, l *callerLoads, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		got := 0
		if c := l.m[key]; c != nil {
			got = c.n[phaseWaiting]
		}
		l.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests of %s waiting, want %d", got, key, n)
		}
		time.Sleep(time.Millisecond)
	}
}
