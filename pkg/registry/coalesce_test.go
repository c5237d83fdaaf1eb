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
	write := func() ([]int, error) {
		n := started.Add(1)
		time.Sleep(200 * time.Microsecond)
		return nil, seqErr(n)
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
			if err := c.do(key, i, nil, write); !errors.As(err, &got) {
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
		_ = c.do("k", 1, nil, func() ([]int, error) { close(inWrite); <-release; panic("boom") })
	}()
	<-inWrite
	waiter := make(chan error)
	go func() { waiter <- c.do("k", 1, nil, func() ([]int, error) { return nil, nil }) }()
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
	if err := c.do("k", 1, nil, func() ([]int, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
}

// TestWriteCoalescerListedCallers: callers that arrive while a write runs are served by it
// when it lists their process (it read the cgroup after their process existed), without a
// write of their own; the others get the next write; after a failed write nobody who arrived
// during it takes its error.
func TestWriteCoalescerListedCallers(t *testing.T) {
	for _, tt := range []struct {
		name      string
		firstErr  error
		wantWrite int64 // writes in all
	}{
		{"listed", nil, 2},
		{"failed write", errors.New("disk"), 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newWriteCoalescer()
			var writes atomic.Int64
			inWrite, release := make(chan struct{}), make(chan struct{})
			first := make(chan error, 1)
			go func() {
				first <- c.do("k", 10, nil, func() ([]int, error) {
					writes.Add(1)
					close(inWrite)
					<-release
					return []int{10, 11, 12}, tt.firstErr
				})
			}()
			<-inWrite
			results := map[int]chan error{}
			for _, pid := range []int{11, 12, 13} {
				ch := make(chan error, 1)
				results[pid] = ch
				go func() {
					ch <- c.do("k", pid, nil, func() ([]int, error) { writes.Add(1); return []int{10, 11, 12, 13}, nil })
				}()
			}
			for {
				c.mu.Lock()
				n := len(c.keys["k"].waiting)
				c.mu.Unlock()
				if n == 3 {
					break
				}
				time.Sleep(time.Millisecond)
			}
			close(release)
			if err := <-first; !errors.Is(err, tt.firstErr) {
				t.Errorf("leader: %v, want %v", err, tt.firstErr)
			}
			for pid, ch := range results {
				if err := <-ch; err != nil {
					t.Errorf("caller %d: %v", pid, err)
				}
			}
			if got := writes.Load(); got != tt.wantWrite {
				t.Errorf("%d writes, want %d", got, tt.wantWrite)
			}
		})
	}
}
