package enforce

import (
	"context"
	"math/rand/v2"
	"os/exec"
	"slices"
	"testing"
	"time"

	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// reactionRounds is how many violations BenchmarkEnforcerReaction times per iteration.
const reactionRounds = 12

// BenchmarkEnforcerReaction is the enforcer's reaction with its defaults (period, grace): a real
// process in a real cgroup, registered and within its limit, is reported by the simulated GPU to
// hold 3× its limit; the time from that report to the process reaped is one reaction. It reports
// p50 and p99 (the largest of the rounds) in ms, and the design's floor measured in the same run
// beside it: the grace (the enforcer acts in the first pass a grace after the first that saw
// the violation, so a reaction lies between the grace and the grace plus a period). Target: p99
// ≤ 1 s.
func BenchmarkEnforcerReaction(b *testing.B) {
	h := rt.Hierarchies(b)[0]
	sim, uuids := simulatedGPUs(b, 1, "reaction-bench")
	uuid := uuids[0]
	var targets []Target
	targetsOf := make(chan []Target, 1)
	targetsOf <- nil
	e := New(Config{}, Deps{
		GPUs: func() []string { return []string{uuid} },
		Targets: func() []Target {
			t := <-targetsOf
			targetsOf <- t
			return t
		},
		Processes:  sim.ProcessMemory,
		CgroupOf:   h.OfPID,
		Registered: func(int, string) bool { return true },
		Kill:       Killer{Cgroups: h}.Kill,
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)

	var reactions []time.Duration
	for b.Loop() {
		for range reactionRounds {
			cg := rt.NewCgroup(b, h)
			cmd := exec.Command("sleep", "600")
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			cg.Move(b, cmd.Process.Pid)
			targets = []Target{{Key: cg.Path, Pod: "p", Container: "c", Cgroups: []string{cg.Path},
				Limits: map[string]uint64{uuid: 1 << 30}, MustRegister: true}}
			<-targetsOf
			targetsOf <- targets
			done := make(chan time.Time, 1)
			go func() { _ = cmd.Wait(); done <- time.Now() }()
			// A round starts right after the previous kill, in step with the passes: start it
			// at a random point of the period, as a tenant's allocation would.
			time.Sleep(rand.N(e.Config().Period))
			start := time.Now()
			if err := sim.SetProcessUsage(uuid, cmd.Process.Pid, 3<<30, nil); err != nil {
				b.Fatal(err)
			}
			select {
			case end := <-done:
				reactions = append(reactions, end.Sub(start))
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				b.Fatal("the process over its limit was not killed within 30 s")
			}
		}
	}
	slices.Sort(reactions)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(reactions[len(reactions)/2]), "p50-ms")
	b.ReportMetric(ms(reactions[len(reactions)-1]), "p99-ms")
	b.ReportMetric(ms(e.Config().Grace), "grace-ms")
	b.ReportMetric(0, "ns/op")
}
