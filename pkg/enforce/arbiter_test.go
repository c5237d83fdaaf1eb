package enforce

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/arbiter"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// burstTenants: a (request 30, ceiling 100) wants the whole GPU; b (guaranteed, 70) is idle.
func burstTenants(t *testing.T) (*node, *smModel, string) {
	n := newNode()
	m := newSMModel(n, DefaultPeriod, 0)
	dir := t.TempDir()
	a := coreTenant("a", "/kubepods/pod1/ctr-a", 30)
	a.CoreCeilings = map[string]uint32{gpuA: 100}
	a.ConfigDir = dir
	b := coreTenant("b", "/kubepods/pod2/ctr-b", 70)
	n.targets = []Target{a, b}
	m.run(11, "/kubepods/pod1/ctr-a", 100)
	return n, m, dir
}

func readAllowance(t *testing.T, dir string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, contract.CoreAllowanceName))
	if err != nil {
		t.Fatal(err)
	}
	got, err := contract.ParseCoreAllowances(data)
	if err != nil {
		t.Fatal(err)
	}
	return got[gpuA]
}

// TestArbiterPublishesTheBurst: with the arbiter, a container alone on its GPU is allowed its
// ceiling — in its allowance file and by the compute rule, which does not report or throttle it
// for using what it was lent — and is back at its request in the file the pass after its
// neighbour wants its part.
func TestArbiterPublishesTheBurst(t *testing.T) {
	n, m, dir := burstTenants(t)
	e := m.enforcer(Config{Cores: CoreThrottle})
	e.deps.Arbiter = arbiter.New(nil)
	n.passes(e, 15*time.Second)
	if got := readAllowance(t, dir); got != 100 {
		t.Fatalf("alone: allowance %d, want its ceiling of 100", got)
	}
	if len(n.events) != 0 || m.everFrozen() {
		t.Fatalf("the burst within its allowance was acted on: events %q, freezes %v", n.events, m.freezes)
	}
	m.run(21, "/kubepods/pod2/ctr-b", 100)
	// The time-slicing splits the GPU while a still may use it all; one pass sees it.
	m.demand[11], m.demand[21] = 50, 50
	e.Pass(t.Context())
	if got := readAllowance(t, dir); got != 30 {
		t.Fatalf("neighbour active: allowance %d, want the request of 30", got)
	}
}

// TestEnforcerHoldsAContainerToItsAllowance: a container that ignores its allowance (no library,
// or a forged config) is held to it, not to its ceiling: its neighbour took its burst back.
func TestEnforcerHoldsAContainerToItsAllowance(t *testing.T) {
	n, m, _ := burstTenants(t)
	e := m.enforcer(Config{Cores: CoreThrottle})
	e.deps.Arbiter = arbiter.New(nil)
	m.run(21, "/kubepods/pod2/ctr-b", 70)
	m.demand[11] = 100 // wants everything, whatever its allowance says
	m.average(e, time.Minute, 11)
	got := m.average(e, time.Minute, 11)
	if got > 30+DefaultCoreMargin {
		t.Errorf("the container that ignores its allowance kept %.1f%% busy, want its allowance of 30 (+%d)", got, DefaultCoreMargin)
	}
	if n.actions["throttle/over-core-limit"] != 1 {
		t.Errorf("actions %v, want one throttle", n.actions)
	}
}
