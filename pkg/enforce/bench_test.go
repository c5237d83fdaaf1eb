package enforce

import (
	"github.com/vgpu-dra/vgpu-dra/pkg/arbiter"

	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// BenchmarkEnforcerPass is one enforcer pass at 100 vGPU containers, each with two processes
// holding memory within its limit and SMs within its cores (the compute rule's window kept), on
// 8 simulated GPUs (go-nvml's mocks: the same NVML calls as
// on a real node), with a real /proc/<pid>/cgroup read per process. The baseline, measured in
// the same run, is the pass's NVML reads alone (memory and utilisation). It reports the pass's time, its share of one
// core at the default period (target ≤ 1 %) and the ratio to the baseline.
func BenchmarkEnforcerPass(b *testing.B) {
	sim, uuids := simulatedGPUs(b, 8, "bench")
	// The processes are this benchmark's own PID's /proc entry, read once per process as a pass
	// reads each process's; each stands for a process of its own container.
	self := os.Getpid()
	h, err := registry.DetectCgroupHierarchy("/proc")
	if err != nil {
		b.Fatal(err)
	}
	byGPU := map[string][]gpu.ProcessMemory{}
	cgroupOf := map[int]string{}
	utilByGPU := map[string][]gpu.ProcessSample{}
	var targets []Target
	for i := range 100 {
		uuid := uuids[i%len(uuids)]
		cg := fmt.Sprintf("/kubepods/besteffort/pod%03d/ctr", i)
		targets = append(targets, Target{Key: fmt.Sprint(i), Pod: fmt.Sprint(i), Cgroups: []string{cg},
			Limits: map[string]uint64{uuid: 4 << 30}, CoreLimits: map[string]uint32{uuid: 30}, MustRegister: true})
		for j := range 2 {
			pid := 1000 + 2*i + j
			cgroupOf[pid] = cg
			byGPU[uuid] = append(byGPU[uuid], gpu.ProcessMemory{PID: pid, UsedBytes: 1 << 30, Known: true})
			utilByGPU[uuid] = append(utilByGPU[uuid], gpu.ProcessSample{PID: pid, SMUtil: 12})
		}
	}
	procs := func(uuid string) ([]gpu.ProcessMemory, error) {
		if _, err := sim.ProcessMemory(uuid); err != nil { // the NVML call a pass makes
			return nil, err
		}
		return byGPU[uuid], nil
	}
	var stamp uint64
	util := func(uuid string, since uint64) ([]gpu.ProcessSample, error) {
		if _, err := sim.ProcessUtilization(uuid, since); err != nil { // the compute rule's NVML call
			return nil, err
		}
		stamp++
		out := utilByGPU[uuid]
		for i := range out {
			out[i].TimeStamp = stamp
		}
		return out, nil
	}
	deps := Deps{
		GPUs:        func() []string { return uuids },
		Targets:     func() []Target { return targets },
		Processes:   procs,
		Utilization: util,
		CgroupOf: func(pid int) (string, error) {
			if _, err := h.OfPID(self); err != nil {
				return "", err
			}
			return cgroupOf[pid], nil
		},
		Registered: func(int, string) bool { return true },
		Kill:       func(int, string) error { b.Fatal("a kill within the limits"); return nil },
	}
	ctx := context.Background()
	var baseline float64
	b.Run("baseline-nvml-reads", func(b *testing.B) {
		for b.Loop() {
			for _, u := range uuids {
				_, _ = procs(u)
				_, _ = util(u, 0)
			}
		}
		baseline = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	// Run makes the memory pass every --enforce-period and the compute pass (with the arbiter,
	// as the kubelet plugin runs it) every --core-period: each is measured alone and the cost
	// of both at their default rates is reported together.
	var memory, compute float64
	b.Run("memory-pass", func(b *testing.B) {
		e := New(Config{}, deps)
		b.ReportAllocs()
		for b.Loop() {
			e.pass(ctx, true, false)
		}
		memory = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		b.ReportMetric(memory*float64(time.Second/DefaultPeriod)/1e9*100, "%core")
	})
	b.Run("compute-pass", func(b *testing.B) {
		d := deps
		d.Arbiter = arbiter.New(nil) // targets without a config directory: nothing written
		e := New(Config{}, d)
		b.ReportAllocs()
		for b.Loop() {
			e.pass(ctx, false, true)
		}
		compute = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		perSecond := memory*float64(time.Second/DefaultPeriod) + compute*float64(time.Second/DefaultCorePeriod)
		b.ReportMetric(compute*float64(time.Second/DefaultCorePeriod)/1e9*100, "%core")
		b.ReportMetric(perSecond/1e9*100, "%core-both")
		if baseline > 0 {
			b.ReportMetric((memory+compute)/baseline, "x-nvml-reads")
		}
	})
}
