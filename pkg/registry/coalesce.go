package registry

import "sync"

// writeCoalescer merges concurrent writes of one pids.config. A container whose processes
// start together (a training job's workers, each loading libvgpu.so) registers many times at
// once; each registration needs a list taken after it arrived, but one list serves them all.
//
// Per key, one leader writes at a time. Callers that arrive meanwhile queue; when the
// leader's write is done, the oldest of them leads the next write for the whole queue. Every
// caller thus gets the result of a write that started after it arrived (so its own process
// is listed), and no caller serves more than the one batch it belongs to.
type writeCoalescer struct {
	mu   sync.Mutex
	keys map[string]*writeQueue
}

type writeQueue struct{ waiting []chan writeTurn }

// writeTurn is what a queued caller receives: the result of the write that covered it, or
// the lead of the next write for batch.
type writeTurn struct {
	err   error
	lead  bool
	batch []chan writeTurn
}

func newWriteCoalescer() *writeCoalescer {
	return &writeCoalescer{keys: map[string]*writeQueue{}}
}

// do runs write, or waits for a write that started after this call, for key.
func (c *writeCoalescer) do(key string, write func() error) error {
	c.mu.Lock()
	q := c.keys[key]
	if q == nil {
		c.keys[key] = &writeQueue{}
		c.mu.Unlock()
		return c.lead(key, nil, write)
	}
	ch := make(chan writeTurn, 1)
	q.waiting = append(q.waiting, ch)
	c.mu.Unlock()
	t := <-ch
	if t.lead {
		return c.lead(key, t.batch, write)
	}
	return t.err
}

func (c *writeCoalescer) lead(key string, batch []chan writeTurn, write func() error) (err error) {
	defer func() {
		// Hand over even when write panics: queued callers must never wait forever.
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, ch := range batch {
			ch <- writeTurn{err: err}
		}
		q := c.keys[key]
		if len(q.waiting) == 0 {
			delete(c.keys, key)
			return
		}
		next := q.waiting
		q.waiting = nil
		next[0] <- writeTurn{lead: true, batch: next[1:]}
	}()
	err = errPanicked
	err = write()
	return err
}
