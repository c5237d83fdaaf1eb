package driver

import (
	"context"
	"sync"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// dirRemovals removes the directories of unprepared claims in the background. Unmounting a
// claim's tmpfs and removing its mount point cost about 150 µs a claim on the machines this is
// measured on (umount takes the kernel's mount lock, rmdir on ext4 its journal): 15-25 ms for a
// 100-claim Unprepare, which the kubelet waited for. Nothing needs them gone before its answer:
// the claim is out of the checkpoint, so no container gets a directory of it, and a directory a
// crash leaves is one of a claim the checkpoint does not know, which start-up removes.
//
// A claim prepared again before its removal ran keeps its directory: the removal runs under the
// claim's lock and skips a claim the checkpoint holds, and Prepare takes a pending removal over
// and runs it itself first (take), so the new claim never starts with the old one's directories.
type dirRemovals struct {
	mu      sync.Mutex
	pending map[string]bool // claim UIDs queued, not yet taken by the worker
	queue   []string
	kick    chan struct{}
	// busy counts the removals queued or running; idle are closed when it drops to zero.
	busy int
	idle []chan struct{}
}

func newDirRemovals() *dirRemovals {
	return &dirRemovals{pending: map[string]bool{}, kick: make(chan struct{}, 1)}
}

// add queues the removal of the claim's directory.
func (r *dirRemovals) add(uid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.pending[uid] {
		r.pending[uid] = true
		r.queue = append(r.queue, uid)
		r.busy++
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// take removes uid from the queue and reports whether it was there: its caller runs the
// removal itself.
func (r *dirRemovals) take(uid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.pending[uid] {
		return false
	}
	delete(r.pending, uid)
	r.doneLocked()
	return true
}

// done counts one removal that next returned as done.
func (r *dirRemovals) done() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.doneLocked()
}

func (r *dirRemovals) doneLocked() {
	if r.busy--; r.busy == 0 {
		for _, ch := range r.idle {
			close(ch)
		}
		r.idle = nil
	}
}

// waitIdle returns a channel closed once no removal is queued or running.
func (r *dirRemovals) waitIdle() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := make(chan struct{})
	if r.busy == 0 {
		close(ch)
	} else {
		r.idle = append(r.idle, ch)
	}
	return ch
}

// next returns the next queued claim, or "" when there is none.
func (r *dirRemovals) next() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.queue) > 0 {
		uid := r.queue[0]
		r.queue = r.queue[1:]
		if r.pending[uid] {
			delete(r.pending, uid)
			return uid
		}
	}
	return ""
}

// runRemovals removes queued claim directories until ctx ends (Start runs it).
func (d *Driver) runRemovals(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for {
		for uid := d.removals.next(); uid != ""; uid = d.removals.next() {
			d.removeDirOf(logger, uid)
			d.removals.done()
		}
		select {
		case <-ctx.Done():
			return
		case <-d.removals.kick:
		}
	}
}

// removeDirOf removes the directory of an unprepared claim, unless it was prepared again.
func (d *Driver) removeDirOf(logger klog.Logger, uid string) {
	unlock := d.locks.lock(uid)
	defer unlock()
	if _, ok := d.deps.Checkpoint.Get(uid); ok {
		return // prepared again: the directory is the new claim's
	}
	if err := d.withFiles(func() error { return d.deps.Dirs.RemoveClaim(uid) }); err != nil {
		d.deps.Metrics.UnprepareErrors.WithLabelValues(metrics.ReasonUnprepareFailure).Inc()
		logger.Error(err, "Removing the directory of an unprepared claim failed; start-up removes it", "uid", uid)
		return
	}
	d.at(StepUnprepareClaimDir)
}

// WaitRemovals returns once the claim directories that Unprepare left to the background are
// removed, or ctx ends; it removes those still queued itself (the worker stops with the
// plugin's context). The plugin calls it when it stops; tests before they look at the disk.
func (d *Driver) WaitRemovals(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	for uid := d.removals.next(); uid != "" && ctx.Err() == nil; uid = d.removals.next() {
		d.removeDirOf(logger, uid)
		d.removals.done()
	}
	select {
	case <-d.removals.waitIdle():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
