package registry

import (
	"slices"
	"sync"
)

// writeCoalescer merges concurrent writes of one pids.config. A container whose processes
// start together (a training job's workers, each loading libvgpu.so) registers many times at
// once; each registration needs a list that holds its own process, and one list serves them all.
//
// Per key, one leader writes at a time. Callers that arrive meanwhile queue. When the write is
// done, the callers queued before it started get its result, and so do those queued while it
// ran whose process it listed (the list was read from the cgroup after their process existed:
// a process is in its cgroup before it connects). The others — and all of them when the write
// failed — are the next batch, led by the oldest of them: every caller thus gets the result of
// a write that lists its process or started after it arrived, and no caller waits for more
// than the write in flight and its own.
type writeCoalescer struct {
	mu   sync.Mutex
	keys map[string]*writeQueue
}

type writeQueue struct{ waiting []waiter }

// waiter is a queued caller: its process and the channel its turn arrives on.
type waiter struct {
	pid int
	ch  chan writeTurn
}

// writeTurn is what a queued caller receives: the result of the write that covered it, or
// the lead of the next write for batch.
type writeTurn struct {
	err   error
	lead  bool
	batch []waiter
}

func newWriteCoalescer() *writeCoalescer {
	return &writeCoalescer{keys: map[string]*writeQueue{}}
}

// do runs write, or waits for a write that lists pid or started after this call, for key.
// write returns the PIDs it wrote. onWait, when not nil, is called before a wait for another
// caller's write.
func (c *writeCoalescer) do(key string, pid int, onWait func(), write func() ([]int, error)) error {
	c.mu.Lock()
	q := c.keys[key]
	if q == nil {
		c.keys[key] = &writeQueue{}
		c.mu.Unlock()
		return c.lead(key, nil, write)
	}
	w := waiter{pid: pid, ch: make(chan writeTurn, 1)}
	q.waiting = append(q.waiting, w)
	c.mu.Unlock()
	if onWait != nil {
		onWait()
	}
	t := <-w.ch
	if t.lead {
		return c.lead(key, t.batch, write)
	}
	return t.err
}

func (c *writeCoalescer) lead(key string, batch []waiter, write func() ([]int, error)) (err error) {
	var listed []int
	defer func() {
		// Hand over even when write panics: queued callers must never wait forever.
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, w := range batch {
			w.ch <- writeTurn{err: err}
		}
		q := c.keys[key]
		var next []waiter
		for _, w := range q.waiting {
			if err == nil && slices.Contains(listed, w.pid) {
				w.ch <- writeTurn{}
				continue
			}
			next = append(next, w)
		}
		q.waiting = nil
		if len(next) == 0 {
			delete(c.keys, key)
			return
		}
		next[0].ch <- writeTurn{lead: true, batch: next[1:]}
	}()
	err = errPanicked
	listed, err = write()
	return err
}
