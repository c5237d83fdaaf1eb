//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// lastingDisagreement is how long the plugin's checkpoint and the kubelet's DRA state may
// disagree about a claim: a Prepare or an Unprepare in flight makes them differ for a moment,
// and a kubelet killed between its Unprepare call and its own checkpoint write leaves a claim it
// unprepares again when it is back, seconds later.
const lastingDisagreement = time.Minute

// checker inspects the node continuously while a fault runs: every running container through
// containerd, the plugin's checkpoint and the kubelet's DRA state.
type checker struct {
	stopCh chan struct{}
	done   chan struct{}
}

// startChecker starts inspecting once a second until stop.
func (s *suite) startChecker(r *run) *checker {
	ch := &checker{stopCh: make(chan struct{}), done: make(chan struct{})}
	firstSeen := map[string]time.Time{}
	go func() {
		defer close(ch.done)
		for {
			s.inspectRuntime(r)
			s.inspectState(r, firstSeen)
			select {
			case <-ch.stopCh:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return ch
}

func (ch *checker) stop() {
	close(ch.stopCh)
	<-ch.done
}

// inspectRuntime checks every running container as containerd holds it: no vGPU container runs
// without its per-container mounts and identity, or with another container's (contract §4).
// This holds at every moment, so any breach is a violation at once.
func (s *suite) inspectRuntime(r *run) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := s.rt.Running(ctx)
	if err != nil {
		r.mu.Lock()
		r.runtimeGap++ // containerd is down (a fault): nothing can start meanwhile
		r.mu.Unlock()
		return
	}
	r.check(1)
	for _, p := range cluster.VGPUProblems(list, cluster.StateDir) {
		r.violate("a vGPU container runs without what NRI gives it: "+p, "containerd's own view of the running container")
	}
}

// inspectState checks that both checkpoints parse (they are only ever replaced whole), that the
// claims of the plugin's checkpoint fit the GPU, and that the checkpoint and the kubelet's DRA
// state do not disagree about a claim for longer than lastingDisagreement.
func (s *suite) inspectState(r *run, firstSeen map[string]time.Time) {
	r.check(2)
	plugin, err := checkpoint.ReadFile(cluster.PluginCheckpoint)
	if err != nil {
		r.violate("the plugin's checkpoint does not parse", err.Error())
		return
	}
	kubelet, err := cluster.ReadKubeletDRAState(cluster.KubeletDRAState)
	if err != nil {
		r.violate("the kubelet's DRA state does not parse", err.Error())
		return
	}
	r.check(2)
	var taken int64
	for _, pc := range plugin.Claims {
		for _, d := range pc.Devices {
			taken += memoryOf(d.MemoryBytes, s.gpuMemory)
		}
	}
	if taken > s.gpuMemory {
		r.violate("the GPU is overcommitted", fmt.Sprintf("the checkpoint's claims take %d bytes of %d", taken, s.gpuMemory))
	}
	now := time.Now()
	current := map[string]bool{}
	for _, d := range cluster.Disagreements(plugin, kubelet) {
		current[d] = true
		if _, ok := firstSeen[d]; !ok {
			firstSeen[d] = now
		}
		if now.Sub(firstSeen[d]) > lastingDisagreement {
			r.violate("the checkpoint and the kubelet disagree: "+d, fmt.Sprintf("since %s", firstSeen[d].Format("15:04:05")))
		}
	}
	for d := range firstSeen {
		if !current[d] {
			delete(firstSeen, d)
		}
	}
}
