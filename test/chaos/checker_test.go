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
	strays := map[string]time.Time{}
	go func() {
		defer close(ch.done)
		for {
			s.inspectRuntime(r, strays)
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
// This holds at every moment, so any breach is a violation at once — but for one, in a fault
// with a strayGrace: a container that containerd created with none of the plugin's adjustment
// because the plugin died under its CreateContainer, which may run until the plugin, back,
// stops it (strays: container ID → first seen).
func (s *suite) inspectRuntime(r *run, strays map[string]time.Time) {
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
	now := time.Now()
	strict := list[:0:0]
	running := map[string]bool{}
	for _, ctr := range list {
		running[ctr.ID] = true
		if !r.toleratesStrays() || !cluster.Unadjusted(ctr) {
			strict = append(strict, ctr)
			continue
		}
		if _, ok := strays[ctr.ID]; !ok {
			strays[ctr.ID] = now
			r.count("containers created without NRI (the plugin killed under their CreateContainer)")
		}
		if now.Sub(strays[ctr.ID]) > r.strayGrace {
			r.violate(fmt.Sprintf("a vGPU container created without NRI runs on: %s/%s/%s (%.12s)", ctr.Namespace, ctr.Pod, ctr.Name, ctr.ID),
				fmt.Sprintf("running without its per-container mounts and identity since %s, longer than %v", strays[ctr.ID].Format("15:04:05"), r.strayGrace))
		}
	}
	for id, since := range strays {
		if !running[id] {
			r.sample("container created without NRI stopped after", now.Sub(since))
			delete(strays, id)
		}
	}
	for _, p := range cluster.VGPUProblems(strict, cluster.StateDir) {
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
