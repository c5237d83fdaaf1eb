//go:build e2e

package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// containerWatch inspects the runtime's running containers every 200 ms, through containerd
// and not through the pods' view, and keeps every vGPU container problem it saw
// (cluster.VGPUProblems: missing per-container mounts or identity, another container's, a
// mount twice).
type containerWatch struct {
	done       chan struct{}
	mu         sync.Mutex
	violations map[string]bool
	checks     int
	err        error
}

// watchContainers starts a watch that runs until ctx ends.
func watchContainers(ctx context.Context) *containerWatch {
	w := &containerWatch{done: make(chan struct{}), violations: map[string]bool{}}
	rt := c.Runtime()
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			list, err := rt.Running(ctx)
			w.mu.Lock()
			if err != nil && w.err == nil && ctx.Err() == nil {
				w.err = err
			}
			if err == nil {
				w.checks++
				for _, v := range cluster.VGPUProblems(list, cluster.StateDir) {
					w.violations[v] = true
				}
			}
			w.mu.Unlock()
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return w
}

// report waits for the watch to end (cancel its context first), fails the test for each
// problem seen and for a watch that never inspected the runtime, and returns the number of
// inspections.
func (w *containerWatch) report(t *testing.T) int {
	t.Helper()
	<-w.done
	for v := range w.violations {
		t.Errorf("a vGPU container ran without what NRI gives it, with another's, or with it twice: %s", v)
	}
	if w.checks == 0 {
		t.Errorf("the runtime was never inspected: %v", w.err)
	}
	return w.checks
}
