package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	kmetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
)

// benchCalls is the number of CreateContainer round trips per plugin.
const benchCalls = 2000

// noopNRIPlugin subscribes to the same events as ours and adjusts nothing: the baseline is the
// runtime's own cost plus one ttrpc round trip to a plugin process.
type noopNRIPlugin struct{ synced atomic.Bool }

func (p *noopNRIPlugin) Synchronize(context.Context, []*api.PodSandbox, []*api.Container) ([]*api.ContainerUpdate, error) {
	p.synced.Store(true)
	return nil, nil
}

func (*noopNRIPlugin) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return nil, nil, nil
}
func (*noopNRIPlugin) StartContainer(context.Context, *api.PodSandbox, *api.Container) error {
	return nil
}
func (*noopNRIPlugin) StopContainer(context.Context, *api.PodSandbox, *api.Container) ([]*api.ContainerUpdate, error) {
	return nil, nil
}
func (*noopNRIPlugin) RemoveContainer(context.Context, *api.PodSandbox, *api.Container) error {
	return nil
}
func (*noopNRIPlugin) StopPodSandbox(context.Context, *api.PodSandbox) error { return nil }

// staticClaims is one claim prepared on the NRI path.
type staticClaims struct{ c nri.Claim }

func (s staticClaims) Prepared(uid string) (nri.Claim, bool) { return s.c, uid == s.c.UID }
func (s staticClaims) List() []nri.Claim                     { return []nri.Claim{s.c} }
func (s staticClaims) ReservedFor(context.Context, string) ([]string, error) {
	return s.c.ReservedFor, nil
}

var benchOnce sync.Once

// BenchmarkNRICreateContainer: CreateContainer round trips through containerd's runtime side
// (adaptation, in a child process) to a plugin in this process — a no-op plugin, then ours with
// a vGPU container (validation, three directories, cache) — 2,000 calls each in the same run.
func BenchmarkNRICreateContainer(b *testing.B) {
	benchOnce.Do(func() { benchNRI(b) })
}

func benchNRI(b *testing.B) {
	dir := shortDir(b)
	const claimUID, podUID = "0c1a1100-0000-4000-8000-0000000b0001", "90d00000-0000-4000-8000-0000000b0001"
	devs := []string{driverName + "/claim=" + claimUID + "-gpu-gpu-0-5a4e0001", driverName + "/claim=" + claimUID + "-common"}
	claim := nri.Claim{UID: claimUID, Namespace: "default", Name: "bench", Path: contract.PathNRI, Completed: true,
		ReservedFor: []string{podUID}, CommonCDIDevice: devs[1],
		Results: []nri.Result{{Request: "gpu", Device: "gpu-0", ShareID: shareA, GPUUUID: "GPU-0", Index: 0, CDIDevice: devs[0]}}}
	pod := &api.PodSandbox{Id: "sandbox-bench", Uid: podUID, Namespace: "default", Name: "bench"}
	ctr := &api.Container{Name: "app", CDIDevices: []*api.CDIDevice{{Name: devs[0]}, {Name: devs[1]}}, Env: []string{
		"PATH=/usr/local/bin:/usr/bin", "HOSTNAME=bench", contract.EnvClaimUID + "=" + claimUID, contract.EnvRegisterUUID + "=",
		contract.EnvVisibleDevicePfx + "0=GPU-0", contract.EnvMemLimitPfx + "0=4096m", contract.EnvCoreLimitPfx + "0=30",
		contract.EnvVisibleDevices + "=", contract.EnvMemLimit + "=", contract.EnvCoreLimit + "=",
	}}
	for j := 1; j < contract.MaxNeutralisedIndices; j++ {
		ctr.Env = append(ctr.Env, fmt.Sprintf("%s%d=", contract.EnvVisibleDevicePfx, j), fmt.Sprintf("%s%d=", contract.EnvMemLimitPfx, j), fmt.Sprintf("%s%d=", contract.EnvCoreLimitPfx, j))
	}

	// measure times benchCalls CreateContainer round trips to plugin p once the runtime
	// delivers them: until p has been synchronized and ready says so, the runtime creates
	// containers without it (which made the count of injected containers fall short).
	measure := func(name string, p any, ready func() bool) []time.Duration {
		socket := filepath.Join(dir, name+".sock")
		rt := startRuntimeProc(b, socket, filepath.Join(dir, name+".json"), 2*time.Second)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st, err := stub.New(p, stub.WithPluginName(name), stub.WithPluginIdx("00"), stub.WithSocketPath(socket))
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Start(ctx); err != nil {
			b.Fatal(err)
		}
		defer st.Stop()
		if ans := rt.do(runtimeCmd{Op: "pod", Pod: pod}); ans.Err != "" {
			b.Fatal(ans.Err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			if ans := rt.do(runtimeCmd{Op: "bench", PodID: pod.Id, Ctr: ctr, N: 10}); ans.Err != "" {
				b.Fatal(ans.Err)
			}
			if ready() {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("plugin %s never took part in CreateContainer", name)
			}
		}
		ans := rt.do(runtimeCmd{Op: "bench", PodID: pod.Id, Ctr: ctr, N: benchCalls})
		if ans.Err != "" {
			b.Fatal(ans.Err)
		}
		rt.kill()
		return ans.Latencies
	}

	ourPlugin := func(layout claimdir.Layout) (*nri.Plugin, *metrics.NRIMetrics) {
		// Prepare made the claim's directory (and its tmpfs) before any container of it.
		if err := layout.EnsureClaimDir(claimUID); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = layout.RemoveClaim(claimUID) })
		m := metrics.NewNRIMetrics(kmetrics.NewKubeRegistry())
		return nri.NewPlugin(nri.Config{Layout: layout}, staticClaims{claim}, m, klog.Background().V(10)), m
	}
	noop := &noopNRIPlugin{}
	base := percentiles(measure("noop", noop, noop.synced.Load))
	b.Logf("CreateContainer round trip, %d calls each (runtime and plugin in separate processes); every container is removed before the next, so each creates its directories and vgpu.config", benchCalls)
	b.Logf("  no-op plugin:               p50 %v  p99 %v  max %v", base[0], base[1], base[2])
	b.ReportMetric(float64(base[0].Microseconds()), "noop-p50-µs")
	b.ReportMetric(float64(base[1].Microseconds()), "noop-p99-µs")
	// The state directory on this machine's disk (ext4): with the claim's tmpfs (the default,
	// --claim-fs-size) the container directories are made in memory ("claim-tmpfs"); without
	// it (--claim-fs-size=0), on the disk ("disk").
	states := []struct {
		name   string
		layout claimdir.Layout
	}{
		{"claim-tmpfs", claimdir.Layout{StateDir: filepath.Join(dir, "state-tmpfs"), ClaimFSBytes: 32 << 20}},
		{"disk", claimdir.Layout{StateDir: filepath.Join(dir, "state-disk")}},
	}
	for _, s := range states {
		ours, m := ourPlugin(s.layout)
		injected := func() float64 {
			n, err := testutil.GetCounterMetricValue(m.Injections)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
		var warm float64
		v := percentiles(measure("vgpu-"+s.name, ours, func() bool { warm = injected(); return warm > 0 }))
		if ours.Cache().Len() != 0 {
			b.Fatalf("cache holds %d entries after every container was removed", ours.Cache().Len())
		}
		if n := injected() - warm; n != benchCalls {
			for _, r := range []string{"claim_not_prepared", "pod_not_reserved", "invalid_value", "wrong_path"} {
				v, _ := testutil.GetCounterMetricValue(m.Rejections.WithLabelValues(r))
				b.Logf("rejections %s: %v", r, v)
			}
			fv, _ := testutil.GetCounterMetricValue(m.Failures.WithLabelValues("create_container"))
			b.Logf("failures: %v", fv)
			b.Fatalf("%v of %d containers were given their directories", n, benchCalls)
		}
		b.Logf("  vgpu plugin, dirs on %-11s: p50 %v  p99 %v  max %v", s.name, v[0], v[1], v[2])
		b.Logf("    added:                    p50 %v  p99 %v  (target <= 150us / <= 500us)", v[0]-base[0], v[1]-base[1])
		b.ReportMetric(float64((v[0] - base[0]).Microseconds()), "added-p50-µs-"+s.name)
		b.ReportMetric(float64((v[1] - base[1]).Microseconds()), "added-p99-µs-"+s.name)
	}
}

// percentiles returns p50, p99 and max.
func percentiles(d []time.Duration) [3]time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return [3]time.Duration{at(0.50), at(0.99), s[len(s)-1]}
}
