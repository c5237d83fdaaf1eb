package nri

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// BenchmarkCreateContainerHook is the hook alone, in process: validation, directories, cache;
// each container is removed (and its directory with it) before the next, as in a churn.
func BenchmarkCreateContainerHook(b *testing.B) {
	f := newFixture(b, testClaim(claimA, gpu0))
	c := f.claims.claims[claimA]
	ctx := context.Background()
	p := pod(podA)
	for i := 0; b.Loop(); i++ {
		ctr := vgpuContainer(fmt.Sprint(i), p, "app", c, true)
		if _, _, err := f.plugin.CreateContainer(ctx, p, ctr); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = f.plugin.RemoveContainer(ctx, p, ctr)
		b.StartTimer()
	}
}

// BenchmarkCreateContainerNotVGPU is the fast path every other container of the node takes.
func BenchmarkCreateContainerNotVGPU(b *testing.B) {
	f := &Plugin{}
	ctr := &api.Container{Id: "x", Name: "app", Env: []string{"PATH=/bin", "HOME=/root", "HOSTNAME=x", "TERM=xterm"}}
	for b.Loop() {
		if adj, _, _ := f.CreateContainer(context.Background(), nil, ctr); adj != nil {
			b.Fatal(adj)
		}
	}
}

// syncScale is the size BenchmarkSynchronize10k replays: 10,000 running vGPU containers, ten
// per claim (issue 18: Synchronize must rebuild the cache from 10,000 containers in ≤ 50 ms; it
// runs under the runtime's request timeout, and every container start on the node waits for it).
const (
	syncContainers = 10000
	syncPerClaim   = 10
)

// BenchmarkSynchronize10k: one Synchronize of 10,000 replayed running vGPU containers (env as
// CDI leaves it, the config mount, a PID whose cgroup is read), against the same replay of
// 10,000 containers that are not ours (the fast path) as the baseline in the same run.
func BenchmarkSynchronize10k(b *testing.B) {
	var claims []Claim
	for c := range syncContainers / syncPerClaim {
		claims = append(claims, testClaim(fmt.Sprintf("0c1a1100-0000-4000-8000-%012d", c), gpu0))
	}
	f := newFixture(b, claims...)
	var pods []*api.PodSandbox
	var ours, plain []*api.Container
	for i := range syncContainers {
		c := claims[i/syncPerClaim]
		p := &api.PodSandbox{Id: fmt.Sprintf("sb-%d", i), Uid: fmt.Sprintf("90d00000-0000-4000-8000-%012d", i), Namespace: "default", Name: fmt.Sprintf("pod-%d", i)}
		c.ReservedFor = append(c.ReservedFor, p.Uid)
		pods = append(pods, p)
		ctr := vgpuContainer(fmt.Sprintf("ctr-%d", i), p, "app", c, true)
		dirs := f.dirs(c.UID, p.Uid, "app")
		ctr.Env = append(ctr.Env, contract.EnvPodUID+"="+p.Uid, contract.EnvContainerName+"=app")
		ctr.Mounts = []*api.Mount{{Source: dirs.Config, Destination: contract.ContainerConfigDir}}
		ctr.State, ctr.Pid = api.ContainerState_CONTAINER_RUNNING, uint32(1000+i)
		f.fakePID(1000+i, fmt.Sprintf("12:pids:/kubepods/pod%s/%d\n0::/kubepods/pod%s/%d\n", p.Uid, i, p.Uid, i))
		ours = append(ours, ctr)
		plain = append(plain, &api.Container{Id: fmt.Sprintf("plain-%d", i), PodSandboxId: p.Id, Name: "app",
			Env: []string{"PATH=/usr/bin", "HOME=/root"}, State: api.ContainerState_CONTAINER_RUNNING, Pid: uint32(1000 + i)})
	}
	for _, c := range claims {
		f.claims.claims[c.UID] = c
	}
	ctx := context.Background()
	// cold: the cache is empty (the plugin just started) and every cgroup is read; warm: the
	// cache knows the containers (the runtime restarted) and keeps their cgroups.
	measure := func(ctrs []*api.Container, cold bool) time.Duration {
		best := time.Duration(0)
		for range 5 {
			f.plugin.cgroupReads.Wait() // the last run's background reads, untimed
			if cold {
				f.plugin.cache.replace(nil, true)
			}
			start := time.Now()
			if _, err := f.plugin.Synchronize(ctx, pods, ctrs); err != nil {
				b.Fatal(err)
			}
			if d := time.Since(start); best == 0 || d < best {
				best = d
			}
		}
		return best
	}
	for b.Loop() {
		base := measure(plain, true)
		cold := measure(ours, true)
		warm := measure(ours, false)
		if n := f.plugin.Cache().Len(); n != syncContainers {
			b.Fatalf("cache holds %d instances, want %d", n, syncContainers)
		}
		b.ReportMetric(float64(cold.Milliseconds()), "sync-cold-ms")
		b.ReportMetric(float64(warm.Milliseconds()), "sync-warm-ms")
		b.ReportMetric(float64(base.Milliseconds()), "baseline-ms")
		b.Logf("Synchronize of %d running vGPU containers (best of 5): %v after a plugin start, %v after a runtime restart; of %d containers that are not ours: %v (%.1f×, %.1f×); target ≤ 50 ms",
			syncContainers, cold, warm, syncContainers, base, float64(cold)/float64(base), float64(warm)/float64(base))
	}
}
