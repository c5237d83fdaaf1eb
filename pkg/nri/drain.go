package nri

import (
	"context"
	"errors"
	"sync"
)

// errDraining fails a vGPU container whose creation reaches a plugin that is shutting down.
var errDraining = errors.New("the node's vGPU plugin is shutting down; the kubelet retries this container once the plugin is back (contract §4)")

// inflight counts the hook calls being served, so that a shutting-down plugin closes its NRI
// connection only once every request it took is answered: containerd's NRI 0.12.3 creates a
// container without its adjustment when the plugin's connection closes under a request
// ("ttrpc: closed"), required-plugins annotation or not (issue 10, measured during helm upgrade).
type inflight struct {
	mu         sync.Mutex
	n          int
	draining   bool
	idle       chan struct{} // closed once draining and n has been 0
	idleClosed bool
}

// enter counts a call in; false once draining (the call must not start).
func (f *inflight) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.draining {
		return false
	}
	f.n++
	return true
}

func (f *inflight) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	f.closeIdleLocked()
}

func (f *inflight) closeIdleLocked() {
	if f.draining && f.n == 0 && !f.idleClosed {
		close(f.idle)
		f.idleClosed = true
	}
}

// drain refuses new calls and waits until those in flight have returned or ctx ends.
func (f *inflight) drain(ctx context.Context) error {
	f.mu.Lock()
	if !f.draining {
		f.draining = true
		f.idle = make(chan struct{})
		f.closeIdleLocked()
	}
	idle := f.idle
	f.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// enterAlways counts in a call that is served even while draining: the cleanup hooks (start,
// stop, remove, stop sandbox) record what the runtime did and are always safe to answer. One
// that arrives after the drain completed may be cut off by the closing connection, which is
// harmless: they are idempotent, and the next session's Synchronize redoes their cleanup.
func (f *inflight) enterAlways() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
}
