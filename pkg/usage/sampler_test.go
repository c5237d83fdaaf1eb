package usage_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2/ktesting"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage/usagetest"
)

const (
	gib        = uint64(1) << 30
	claimUID   = "c1a2b3c4-d5e6-4f70-8192-a3b4c5d6e7f8"
	podA, podB = "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e", "7d3e1f0a-2b4c-4d5e-8f6a-9b0c1d2e3f4a"
)

// node is a test node: simulated H200s whose processes are the sampler's own (as the plugin
// wires them), and targets made of real files in temp directories.
type node struct {
	t       testing.TB
	sim     *gpu.Simulated
	uuids   []string
	targets []usage.Target
	errors  map[string]int
	sampler *usage.Sampler
	reg     metrics.KubeRegistry
	// allowances is what the arbiter has divided: (target key, GPU) → percent.
	allowances map[[2]string]float64
}

// newNode: nvml nil asks the simulated GPUs, as the plugin does.
func newNode(t testing.TB, gpus int, cfg usage.Config, nvml usage.NVML) *node {
	t.Helper()
	sim, err := gpu.NewSimulated("dgx-h200", gpus, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	_, ctx := ktesting.NewTestContext(t)
	devs, err := sim.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, sim: sim, errors: map[string]int{}, allowances: map[[2]string]float64{}}
	for _, d := range devs {
		n.uuids = append(n.uuids, d.UUID)
	}
	if nvml == nil {
		nvml = sim
	}
	var collector *usage.Collector
	n.sampler = usage.NewSampler(cfg, usage.Deps{
		Targets: func() []usage.Target { return append([]usage.Target(nil), n.targets...) },
		GPUs: func() []usage.GPU {
			out := make([]usage.GPU, len(devs))
			for i, d := range devs {
				out[i] = usage.GPU{UUID: d.UUID, Device: fmt.Sprintf("gpu-%d", d.Index), PublishedMemory: int64(d.MemoryBytes),
					AllocatedMemory: 14 * int64(gib), AllocatedCores: 50, Shares: 2, Healthy: i == 0}
			}
			return out
		},
		NVML: nvml,
		Allowance: func(key, gpu string) (float64, bool) {
			a, ok := n.allowances[[2]string{key, gpu}]
			return a, ok
		},
		ReadError: func(source string) { n.errors[source]++ },
		Published: func(s *usage.Snapshot) { collector.Prepare(s) },
	})
	sim.SetProcesses(n.sampler.SimulatedProcessesOn)
	n.reg = metrics.NewKubeRegistry()
	collector = usage.NewCollector(n.sampler.Snapshot)
	n.reg.CustomMustRegister(collector)
	return n
}

// target adds a target whose files are written as given: config "" leaves vgpu.config out,
// pids nil leaves pids.config out, ledger nil leaves the ledger out.
func (n *node) target(t usage.Target, cfg string, pids []int, ledger *usagetest.Ledger) {
	n.t.Helper()
	root := n.t.TempDir()
	t.ConfigDir, t.VMemNodeDir = filepath.Join(root, "config"), filepath.Join(root, "vmem_node")
	for _, d := range []string{t.ConfigDir, t.VMemNodeDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			n.t.Fatal(err)
		}
	}
	if cfg != "" {
		if err := os.WriteFile(filepath.Join(t.ConfigDir, contract.ContainerConfigName), []byte(cfg), 0o644); err != nil {
			n.t.Fatal(err)
		}
	}
	if pids != nil {
		var b strings.Builder
		for _, p := range pids {
			fmt.Fprintf(&b, "%d\n", p)
		}
		if err := os.WriteFile(filepath.Join(t.ConfigDir, contract.PIDsConfigName), []byte(b.String()), 0o644); err != nil {
			n.t.Fatal(err)
		}
	}
	if ledger != nil {
		usagetest.WriteLedger(n.t, t.VMemNodeDir, *ledger)
	}
	n.targets = append(n.targets, t)
}

func config(pod, container string, gpus ...string) string {
	s := "version 1\nclaim " + claimUID + "\n"
	if pod != "" {
		s += "pod " + pod + "\ncontainer " + container + "\n"
	} else {
		s += "register 5f0c3a1e-8d2b-4e6f-9a1c-2b3d4e5f6a7b\n"
	}
	for _, g := range gpus {
		s += g + "\n"
	}
	return s
}

// sample takes one sample and compares the named metrics with want (exposition text).
func (n *node) sample(want string, names ...string) {
	n.t.Helper()
	_, ctx := ktesting.NewTestContext(n.t)
	n.sampler.Sample(ctx)
	if err := testutil.GatherAndCompare(n.reg, strings.NewReader(want), names...); err != nil {
		n.t.Error(err)
	}
}

const help = `
# HELP vgpu_dra_container_memory_used_bytes [ALPHA] GPU memory the container uses on the GPU, from its libvgpu.so ledger: its live processes' allocations plus the driver memory NVML sees and the hooks do not.
# TYPE vgpu_dra_container_memory_used_bytes gauge
# HELP vgpu_dra_container_memory_limit_bytes [ALPHA] GPU memory limit libvgpu.so enforces for the container on the GPU (the GPU's published memory for a whole-GPU claim).
# TYPE vgpu_dra_container_memory_limit_bytes gauge
# HELP vgpu_dra_container_cores_limit_percent [ALPHA] Share of the GPU's SMs the container may use, in percent (100 without a limit).
# TYPE vgpu_dra_container_cores_limit_percent gauge
# HELP vgpu_dra_container_cores_used_percent [ALPHA] SM utilisation of the container's registered processes on the GPU, in percent: the sum of NVML's newest per-process samples since the previous sample.
# TYPE vgpu_dra_container_cores_used_percent gauge
# HELP vgpu_dra_container_memory_refusals_total [ALPHA] Allocations libvgpu.so refused the container because they would pass its memory limit (CUDA_ERROR_OUT_OF_MEMORY), on any GPU.
# TYPE vgpu_dra_container_memory_refusals_total counter
# HELP vgpu_dra_usage_series_omitted [ALPHA] (container, GPU) pairs left out of the per-container series by the series bound.
# TYPE vgpu_dra_usage_series_omitted gauge
`

var containerMetrics = []string{
	"vgpu_dra_container_memory_used_bytes", "vgpu_dra_container_memory_limit_bytes", "vgpu_dra_container_cores_limit_percent",
	"vgpu_dra_container_cores_used_percent", "vgpu_dra_container_memory_refusals_total", "vgpu_dra_usage_series_omitted",
}

// TestSamplerContainers: two containers share GPU 0 on the NRI path, a per-claim claim has no
// ledger yet, a whole-GPU container passes through; the figures are the ledgers', the
// vgpu.configs' and the simulated GPU's deterministic samples of the PIDs in pids.config.
func TestSamplerContainers(t *testing.T) {
	n := newNode(t, 2, usage.Config{}, nil)
	g0, g1 := n.uuids[0], n.uuids[1]
	n.target(usage.Target{Namespace: "team", Pod: "a", Container: "app", Claim: "share-a"},
		config(podA, "app", "gpu 0 "+g0+" 10737418240 30"), []int{100, 114},
		&usagetest.Ledger{Refused: 3, Slots: []usagetest.Slot{usagetest.Live(map[int]uint64{0: 9 * gib})}})
	n.target(usage.Target{Namespace: "team", Pod: "b", Container: "app", Claim: "share-b"},
		config(podB, "app", "gpu 0 "+g0+" 4294967296 20"), []int{4243},
		&usagetest.Ledger{Unseen: map[int]uint64{0: 512}, Slots: []usagetest.Slot{usagetest.Live(map[int]uint64{0: gib}), {Used: map[int]uint64{0: gib}, State: usage.LedgerSlotUsed}}})
	n.target(usage.Target{Namespace: "batch", Claim: "per-claim"}, config("", "", "gpu 1 "+g1+" 2147483648 10"), nil, nil)
	n.target(usage.Target{Namespace: "batch", Pod: "whole", Container: "train", Claim: "whole"}, config(podB, "train", "gpu 1 "+g1+" 0 0"), nil, nil)
	labels := func(ns, pod, ctr, claim, g string) string {
		return fmt.Sprintf(`{claim=%q,container=%q,gpu_uuid=%q,namespace=%q,pod=%q}`, claim, ctr, g, ns, pod)
	}
	a, b := labels("team", "a", "app", "share-a", g0), labels("team", "b", "app", "share-b", g0)
	pc, whole := labels("batch", "", "", "per-claim", g1), labels("batch", "whole", "train", "whole", g1)
	want := help + fmt.Sprintf(`
vgpu_dra_container_memory_used_bytes%[1]s 9.663676416e+09
vgpu_dra_container_memory_used_bytes%[2]s 1.073742336e+09
vgpu_dra_container_memory_used_bytes%[3]s 0
vgpu_dra_container_memory_limit_bytes%[1]s 1.073741824e+10
vgpu_dra_container_memory_limit_bytes%[2]s 4.294967296e+09
vgpu_dra_container_memory_limit_bytes%[3]s 2.147483648e+09
vgpu_dra_container_memory_limit_bytes%[4]s 1.51397597184e+11
vgpu_dra_container_cores_limit_percent%[1]s 30
vgpu_dra_container_cores_limit_percent%[2]s 20
vgpu_dra_container_cores_limit_percent%[3]s 10
vgpu_dra_container_cores_limit_percent%[4]s 100
vgpu_dra_container_cores_used_percent%[1]s 4
vgpu_dra_container_cores_used_percent%[2]s 7
vgpu_dra_container_cores_used_percent%[3]s 0
vgpu_dra_container_cores_used_percent%[4]s 0
vgpu_dra_container_memory_refusals_total{claim="share-a",container="app",namespace="team",pod="a"} 3
vgpu_dra_container_memory_refusals_total{claim="share-b",container="app",namespace="team",pod="b"} 0
vgpu_dra_container_memory_refusals_total{claim="per-claim",container="",namespace="batch",pod=""} 0
vgpu_dra_container_memory_refusals_total{claim="whole",container="train",namespace="batch",pod="whole"} 0
vgpu_dra_usage_series_omitted 0
`, a, b, pc, whole)
	// a: PIDs 100 (30 % of its 15-point share of a's 30 %: 4) and 114 (5 % of 15: 0); b: PID
	// 4243 (35 % of 20: 7); nothing runs on GPU 1.
	n.sample(want, containerMetrics...)

	gpuWant := fmt.Sprintf(`
# HELP vgpu_dra_gpu_containers [ALPHA] vGPU containers using the GPU (a per-claim-path claim counts once for all its containers).
# TYPE vgpu_dra_gpu_containers gauge
vgpu_dra_gpu_containers{device="gpu-0",gpu_uuid=%[1]q} 2
vgpu_dra_gpu_containers{device="gpu-1",gpu_uuid=%[2]q} 2
# HELP vgpu_dra_gpu_healthy [ALPHA] 1 while the GPU is healthy, 0 after a health event made it unhealthy.
# TYPE vgpu_dra_gpu_healthy gauge
vgpu_dra_gpu_healthy{device="gpu-0",gpu_uuid=%[1]q} 1
vgpu_dra_gpu_healthy{device="gpu-1",gpu_uuid=%[2]q} 0
# HELP vgpu_dra_gpu_memory_allocated_bytes [ALPHA] Memory of the GPU taken by prepared claims.
# TYPE vgpu_dra_gpu_memory_allocated_bytes gauge
vgpu_dra_gpu_memory_allocated_bytes{device="gpu-0",gpu_uuid=%[1]q} 1.5032385536e+10
vgpu_dra_gpu_memory_allocated_bytes{device="gpu-1",gpu_uuid=%[2]q} 1.5032385536e+10
# HELP vgpu_dra_gpu_cores_published_percent [ALPHA] Cores capacity the GPU is published with, in percent of its SMs (always 100).
# TYPE vgpu_dra_gpu_cores_published_percent gauge
vgpu_dra_gpu_cores_published_percent{device="gpu-0",gpu_uuid=%[1]q} 100
vgpu_dra_gpu_cores_published_percent{device="gpu-1",gpu_uuid=%[2]q} 100
`, g0, g1)
	if err := testutil.GatherAndCompare(n.reg, strings.NewReader(gpuWant), "vgpu_dra_gpu_containers", "vgpu_dra_gpu_healthy",
		"vgpu_dra_gpu_memory_allocated_bytes", "vgpu_dra_gpu_cores_published_percent"); err != nil {
		t.Error(err)
	}

	// The containers go: their series vanish with the next sample, the GPUs' stay.
	n.targets = n.targets[2:3]
	n.sample(help+fmt.Sprintf(`
vgpu_dra_container_memory_used_bytes%[1]s 0
vgpu_dra_container_memory_limit_bytes%[1]s 2.147483648e+09
vgpu_dra_container_cores_limit_percent%[1]s 10
vgpu_dra_container_cores_used_percent%[1]s 0
vgpu_dra_container_memory_refusals_total{claim="per-claim",container="",namespace="batch",pod=""} 0
vgpu_dra_usage_series_omitted 0
`, pc), containerMetrics...)
	if len(n.errors) != 0 {
		t.Errorf("read errors %v, want none", n.errors)
	}
}

// TestSamplerComputeTerms: each container's ceiling, class and the arbiter's current allowance
// on each GPU (contract §16) — the ceiling is the limit without a burst, a GPU without a core
// limit has no class, and the allowance is there only while the arbiter has one for the
// (target, GPU) pair, as of the sample.
func TestSamplerComputeTerms(t *testing.T) {
	n := newNode(t, 2, usage.Config{}, nil)
	g0, g1 := n.uuids[0], n.uuids[1]
	n.target(usage.Target{Namespace: "team", Pod: "a", Container: "app", Claim: "share-a", Key: "ctr-a",
		Compute: map[string]usage.ComputeTerms{g0: {Class: "Guaranteed", Ceiling: 30}}},
		config(podA, "app", "gpu 0 "+g0+" 1073741824 30"), nil, nil)
	n.target(usage.Target{Namespace: "team", Pod: "b", Container: "app", Claim: "share-b", Key: "ctr-b",
		Compute: map[string]usage.ComputeTerms{g0: {Class: "BestEffort", Ceiling: 100}}},
		config(podB, "app", "gpu 0 "+g0+" 1073741824 20"), nil, nil)
	n.target(usage.Target{Namespace: "batch", Claim: "per-claim", Key: "claim/" + claimUID,
		Compute: map[string]usage.ComputeTerms{g1: {Class: "Guaranteed", Ceiling: 60}}},
		config("", "", "gpu 1 "+g1+" 1073741824 10"), nil, nil)
	n.target(usage.Target{Namespace: "batch", Pod: "whole", Container: "train", Claim: "whole", Key: "ctr-w"},
		config(podB, "train", "gpu 1 "+g1+" 0 0"), nil, nil)
	n.allowances[[2]string{"ctr-a", g0}] = 30
	n.allowances[[2]string{"ctr-b", g0}] = 65
	n.allowances[[2]string{"ctr-b", g1}] = 99 // not a GPU of ctr-b's: never shown
	labels := func(ns, pod, ctr, claim, g string) string {
		return fmt.Sprintf(`claim=%q,container=%q,gpu_uuid=%q,namespace=%q,pod=%q`, claim, ctr, g, ns, pod)
	}
	a, b := labels("team", "a", "app", "share-a", g0), labels("team", "b", "app", "share-b", g0)
	pc, whole := labels("batch", "", "", "per-claim", g1), labels("batch", "whole", "train", "whole", g1)
	classed := func(l, class string) string { // the labels in the exposition's (sorted) order
		claim, rest, _ := strings.Cut(l, ",")
		return fmt.Sprintf("%s,class=%q,%s", claim, class, rest)
	}
	const termsHelp = `
# HELP vgpu_dra_container_cores_ceiling_percent [ALPHA] Share of the GPU's SMs the container may burst to when the GPU has idle time, in percent: its class's and claim configuration's ceiling (container_cores_limit_percent without a burst).
# TYPE vgpu_dra_container_cores_ceiling_percent gauge
# HELP vgpu_dra_container_cores_allowance_percent [ALPHA] Share of the GPU's SMs the compute arbiter allows the container now, in percent, between its limit and its ceiling (absent where the arbiter does not divide the GPU).
# TYPE vgpu_dra_container_cores_allowance_percent gauge
# HELP vgpu_dra_container_cores_class_info [ALPHA] The container's compute class on the GPU (Guaranteed or BestEffort), always 1; absent without a core limit.
# TYPE vgpu_dra_container_cores_class_info gauge
`
	names := []string{"vgpu_dra_container_cores_ceiling_percent", "vgpu_dra_container_cores_allowance_percent", "vgpu_dra_container_cores_class_info"}
	// The per-claim claim has no allowance yet (before the arbiter's first pass).
	n.sample(termsHelp+fmt.Sprintf(`
vgpu_dra_container_cores_ceiling_percent{%[1]s} 30
vgpu_dra_container_cores_ceiling_percent{%[2]s} 100
vgpu_dra_container_cores_ceiling_percent{%[3]s} 60
vgpu_dra_container_cores_ceiling_percent{%[4]s} 100
vgpu_dra_container_cores_allowance_percent{%[1]s} 30
vgpu_dra_container_cores_allowance_percent{%[2]s} 65
vgpu_dra_container_cores_class_info{%[5]s} 1
vgpu_dra_container_cores_class_info{%[6]s} 1
vgpu_dra_container_cores_class_info{%[7]s} 1
`, a, b, pc, whole, classed(a, "Guaranteed"), classed(b, "BestEffort"), classed(pc, "Guaranteed")), names...)

	// The arbiter divides GPU 1 for the claim and forgets container b (gone from its pass): the
	// next sample says so, a scrape in between still the sample before.
	n.allowances[[2]string{"claim/" + claimUID, g1}] = 45
	delete(n.allowances, [2]string{"ctr-b", g0})
	if err := testutil.GatherAndCompare(n.reg, strings.NewReader(termsHelp+fmt.Sprintf(`
vgpu_dra_container_cores_allowance_percent{%[1]s} 30
vgpu_dra_container_cores_allowance_percent{%[2]s} 65
`, a, b)), "vgpu_dra_container_cores_allowance_percent"); err != nil {
		t.Error(err)
	}
	n.sample(termsHelp+fmt.Sprintf(`
vgpu_dra_container_cores_allowance_percent{%[1]s} 30
vgpu_dra_container_cores_allowance_percent{%[2]s} 45
`, a, pc), "vgpu_dra_container_cores_allowance_percent")
}

// TestSamplerBrokenFiles: what cannot be read is left out, counted and never fatal.
func TestSamplerBrokenFiles(t *testing.T) {
	n := newNode(t, 1, usage.Config{}, nil)
	g0 := n.uuids[0]
	n.target(usage.Target{Namespace: "team", Pod: "noconfig", Container: "app", Claim: "x"}, "", []int{5}, nil)
	n.target(usage.Target{Namespace: "team", Pod: "badledger", Container: "app", Claim: "y"},
		config(podA, "app", "gpu 0 "+g0+" 1073741824 0"), []int{7},
		&usagetest.Ledger{Patch: func(b []byte) { b[usage.LedgerOffVersion] = 9 }})
	n.target(usage.Target{Namespace: "team", Pod: "badpids", Container: "app", Claim: "z"},
		config(podB, "app", "gpu 0 "+g0+" 1073741824 0"), []int{-1}, &usagetest.Ledger{})
	l := func(pod, claim string) string {
		return fmt.Sprintf(`{claim=%q,container="app",gpu_uuid=%q,namespace="team",pod=%q}`, claim, g0, pod)
	}
	// PID 7 (40 %) runs on GPU 0; badpids' list did not read, so it has no process.
	n.sample(help+fmt.Sprintf(`
vgpu_dra_container_memory_used_bytes%[2]s 0
vgpu_dra_container_memory_limit_bytes%[1]s 1.073741824e+09
vgpu_dra_container_memory_limit_bytes%[2]s 1.073741824e+09
vgpu_dra_container_cores_limit_percent%[1]s 100
vgpu_dra_container_cores_limit_percent%[2]s 100
vgpu_dra_container_cores_used_percent%[1]s 40
vgpu_dra_container_cores_used_percent%[2]s 0
vgpu_dra_container_memory_refusals_total{claim="z",container="app",namespace="team",pod="badpids"} 0
vgpu_dra_usage_series_omitted 0
`, l("badledger", "y"), l("badpids", "z")), containerMetrics...)
	if want := map[string]int{usage.SourceConfig: 1, usage.SourceLedger: 1, usage.SourcePIDs: 1}; fmt.Sprint(n.errors) != fmt.Sprint(want) {
		t.Errorf("read errors %v, want %v", n.errors, want)
	}
}

// failingNVML stands in for a driver whose per-process queries fail.
type failingNVML struct{}

func (failingNVML) ProcessUtilization(string, uint64) ([]gpu.ProcessSample, error) {
	return nil, errors.New("NVML: not supported")
}
func (failingNVML) ProcessMemory(string) ([]gpu.ProcessMemory, error) {
	return nil, errors.New("NVML: no permission")
}

// TestSamplerBoundAndNVMLErrors: past the bound, rows are left out in a stable order and
// counted; an NVML failure leaves out the figures NVML would have given, nothing else.
func TestSamplerBoundAndNVMLErrors(t *testing.T) {
	n := newNode(t, 1, usage.Config{MaxSeries: 2}, failingNVML{})
	g0 := n.uuids[0]
	for _, pod := range []string{"c", "a", "b"} {
		n.target(usage.Target{Namespace: "team", Pod: pod, Container: "app", Claim: pod}, config(podA, "app", "gpu 0 "+g0+" 1073741824 50"), []int{9}, nil)
	}
	l := func(pod string) string {
		return fmt.Sprintf(`{claim=%q,container="app",gpu_uuid=%q,namespace="team",pod=%q}`, pod, g0, pod)
	}
	n.sample(help+fmt.Sprintf(`
vgpu_dra_container_memory_used_bytes%[1]s 0
vgpu_dra_container_memory_used_bytes%[2]s 0
vgpu_dra_container_memory_limit_bytes%[1]s 1.073741824e+09
vgpu_dra_container_memory_limit_bytes%[2]s 1.073741824e+09
vgpu_dra_container_cores_limit_percent%[1]s 50
vgpu_dra_container_cores_limit_percent%[2]s 50
vgpu_dra_container_memory_refusals_total{claim="a",container="app",namespace="team",pod="a"} 0
vgpu_dra_container_memory_refusals_total{claim="b",container="app",namespace="team",pod="b"} 0
vgpu_dra_usage_series_omitted 1
`, l("a"), l("b")), containerMetrics...)
	if n.errors[usage.SourceNVML] != 2 {
		t.Errorf("NVML errors counted %d, want 2 (utilisation and memory)", n.errors[usage.SourceNVML])
	}
}

// TestScrapeWhileSampling: scrapes read snapshots while the sampler publishes new ones; under
// -race this proves neither takes the other's data from under it, and every scrape sees one
// whole snapshot.
func TestScrapeWhileSampling(t *testing.T) {
	n := newNode(t, 2, usage.Config{}, nil)
	for i := range 10 {
		n.target(usage.Target{Namespace: "team", Pod: fmt.Sprintf("p%d", i), Container: "app", Claim: "c"},
			config(podA, "app", "gpu 0 "+n.uuids[i%2]+" 1073741824 10"), []int{100 + i}, &usagetest.Ledger{})
	}
	_, ctx := ktesting.NewTestContext(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20 {
			n.sampler.Sample(ctx)
		}
	}()
	for {
		families, err := n.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "vgpu_dra_container_memory_limit_bytes" && len(f.GetMetric()) != 10 {
				t.Fatalf("a scrape saw %d containers of 10", len(f.GetMetric()))
			}
		}
		select {
		case <-done:
			return
		default:
		}
	}
}
