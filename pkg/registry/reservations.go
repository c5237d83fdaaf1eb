package registry

import (
	"context"
	"slices"
	"sync"
	"time"
)

// reservations re-reads, on a per-claim registration whose pod is not in the recorded
// reservedFor, the claim from the API server (contract §5): the kubelet does not prepare a
// claim again for a second pod that shares it. Reads are bounded per claim: one at a time,
// and at most one started per interval. A caller of a connection may be any tenant that knows
// the claim's register UUID, and the API client's rate limit is shared with Prepare: without
// the bound, misses sent in a loop would spend it.
type reservations struct {
	reader   ReservationReader
	timeout  time.Duration
	interval time.Duration
	now      func() time.Time

	mu    sync.Mutex
	reads map[string]*claimRead // by claim UID: the last read
}

// claimRead is one read of a claim; pods and err are set before done is closed.
type claimRead struct {
	started time.Time
	done    chan struct{}
	pods    []string
	err     error
}

func newReservations(reader ReservationReader, timeout, interval time.Duration, now func() time.Time) *reservations {
	return &reservations{reader: reader, timeout: timeout, interval: interval, now: now, reads: map[string]*claimRead{}}
}

// check reports whether pod is in the claim's reservedFor as the API server says now. It
// reads the claim, or shares a read in progress; when a read started less than interval ago
// and did not list the pod, it reads nothing and returns how long to wait before asking
// again (the read may have begun before the pod was reserved).
func (r *reservations) check(ctx context.Context, claimUID, pod string) (reserved bool, wait time.Duration, err error) {
	r.mu.Lock()
	last := r.reads[claimUID]
	now := r.now()
	if last != nil && now.Sub(last.started) < r.interval {
		r.mu.Unlock()
		select {
		case <-last.done:
		case <-ctx.Done():
			return false, 0, ctx.Err()
		}
		if last.err == nil && slices.Contains(last.pods, pod) {
			return true, 0, nil
		}
		return false, max(last.started.Add(r.interval).Sub(r.now()), time.Millisecond), nil
	}
	read := &claimRead{started: now, done: make(chan struct{})}
	r.reads[claimUID] = read
	r.mu.Unlock()

	rctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	read.pods, read.err = r.reader.ReservedFor(rctx, claimUID)
	close(read.done)
	if read.err != nil {
		return false, 0, read.err
	}
	return slices.Contains(read.pods, pod), 0, nil
}

// prune forgets reads that ended more than interval ago.
func (r *reservations) prune() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	for uid, read := range r.reads {
		select {
		case <-read.done:
			if now.Sub(read.started) >= r.interval {
				delete(r.reads, uid)
			}
		default:
		}
	}
}
