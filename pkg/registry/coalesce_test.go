package registry

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type seqErr int64

func (e seqErr) Error() string { return fmt.Sprintf("write %d", int64(e)) }

// TestWriteCoalescer: concurrent callers share writes, and each one's result comes from a
// write that started after it arrived.
func TestWriteCoalescer(t *testing.T) {
	c := newWriteCoalescer()
	var started atomic.Int64
	write := func() error {
		n := started.Add(1)
		time.Sleep(200 * time.Microsecond)
		return seqErr(n)
	}
	const callers = 200
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			key := "a"
			if i%4 == 0 {
				key = "b"
			}
			arrived := started.Load()
			var got seqErr
			if err := c.do(key, write); !errors.As(err, &got) {
				t.Errorf("caller %d: %v", i, err)
				return
			}
			if int64(got) <= arrived {
				t.Errorf("caller %d arrived after write %d started but got its result", i, arrived)
			}
		})
	}
	wg.Wait()
	t.Logf("%d callers, %d writes", callers, started.Load())
	if len(c.keys) != 0 {
		t.Fatalf("keys left: %v", c.keys)
	}
}

// TestWriteCoalescerPanic: a leader's panic reaches its own caller; the callers queued
// behind it are answered and the next write runs.
func TestWriteCoalescerPanic(t *testing.T) {
	c := newWriteCoalescer()
	inWrite := make(chan struct{})
	release := make(chan struct{})
	done := make(chan any)
	go func() {
		defer func() { done <- recover() }()
		_ = c.do("k", func() error { close(inWrite); <-release; panic("boom") })
	}()
	<-inWrite
	waiter := make(chan error)
	go func() { waiter <- c.do("k", func() error { return nil }) }()
	for {
		c.mu.Lock()
		n := len(c.keys["k"].waiting)
		c.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if r := <-done; r == nil {
		t.Fatal("the leader's panic was swallowed")
	}
	// The waiter leads the next write itself (it arrived after the panicking one started).
	if err := <-waiter; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if err := c.do("k", func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}
