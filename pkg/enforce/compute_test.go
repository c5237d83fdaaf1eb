package enforce

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// smModel is a simulated GPU's SMs for the compute rule: each process wants a share of the SMs
// (what it would use unthrottled), and NVML reports, for each pass, that share times the part
// of the previous period its cgroup was thawed, plus NVML's sampling noise.
type smModel struct {
	n      *node
	period time.Duration
	demand map[int]float64 // PID → percent
	noise  float64         // ± percent, uniform
	rng    *rand.Rand
	// frozen is the share of the coming period each cgroup is frozen for (the throttle's duty).
	frozen      map[string]float64
	frozenSince map[string]time.Time
	freezes     []string // "cg frozen|thawed", in order
	reads       int
}

func newSMModel(n *node, period time.Duration, noise float64) *smModel {
	return &smModel{n: n, period: period, demand: map[int]float64{}, noise: noise, rng: rand.New(rand.NewPCG(1, 2)),
		frozen: map[string]float64{}, frozenSince: map[string]time.Time{}}
}

func (m *smModel) run(pid int, cg string, percent float64) {
	m.n.cgroups[pid] = cg
	m.demand[pid] = percent
}

func (m *smModel) utilization(uuid string, since uint64) ([]gpu.ProcessSample, error) {
	m.reads++
	if uuid != gpuA {
		return nil, nil
	}
	ts := uint64(m.n.now.UnixMicro())
	var out []gpu.ProcessSample
	pids := mapsKeys(m.demand)
	slices.Sort(pids)
	for _, pid := range pids {
		u := m.demand[pid] * (1 - m.frozen[m.n.cgroups[pid]])
		u += (m.rng.Float64()*2 - 1) * m.noise
		out = append(out, gpu.ProcessSample{PID: pid, SMUtil: uint32(math.Round(math.Max(0, math.Min(100, u)))), TimeStamp: ts})
	}
	clear(m.frozen)
	return out, nil
}

func mapsKeys(m map[int]float64) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func (m *smModel) freeze(cg string, frozen bool) error {
	word := "thawed"
	if frozen {
		word = "frozen"
		m.frozenSince[cg] = m.n.now
	}
	m.freezes = append(m.freezes, cg+" "+word)
	return nil
}

// everFrozen says whether any cgroup was frozen (the takeover's thaw sweep writes only "thawed").
func (m *smModel) everFrozen() bool {
	return slices.ContainsFunc(m.freezes, func(s string) bool { return strings.HasSuffix(s, " frozen") })
}

// after is the throttle's thaw: the cgroup was frozen for d of the period, and is thawed.
func (m *smModel) after(d time.Duration, f func()) {
	for cg, at := range m.frozenSince {
		if at.Equal(m.n.now) {
			m.frozen[cg] = math.Min(1, float64(d)/float64(m.period))
		}
	}
	f()
}

func (m *smModel) enforcer(cfg Config) *Enforcer {
	e := m.n.enforcer(cfg)
	e.deps.Utilization = m.utilization
	e.deps.Freeze = m.freeze
	e.deps.After = m.after
	return e
}

// oneCoreTenant is a node with one container, a, of core limit cores on gpuA, whose process 11
// wants demand percent of the SMs, NVML's samples noisy by ± noise.
func oneCoreTenant(noise float64, cores uint32, demand float64) (*node, *smModel) {
	n := newNode()
	m := newSMModel(n, DefaultPeriod, noise)
	n.targets = []Target{coreTenant("a", "/kubepods/pod1/ctr-a", cores)}
	m.run(11, "/kubepods/pod1/ctr-a", demand)
	return n, m
}

func coreTenant(key, cg string, cores uint32) Target {
	t := tenant(key, cg, 8*GiB)
	t.CoreLimits = map[string]uint32{gpuA: cores}
	return t
}

// average runs passes for d and returns the mean utilisation the processes really had (without
// NVML's noise), summed.
func (m *smModel) average(e *Enforcer, d time.Duration, pids ...int) float64 {
	var sum float64
	count := 0
	for end := m.n.now.Add(d); !m.n.now.After(end); m.n.now = m.n.now.Add(e.cfg.Period) {
		for _, pid := range pids {
			sum += m.demand[pid] * (1 - m.frozen[m.n.cgroups[pid]])
		}
		e.Pass(context.Background())
		count++
	}
	return sum / float64(count)
}

func TestCoreReportedOncePerEpisode(t *testing.T) {
	n := newNode()
	m := newSMModel(n, DefaultPeriod, 0)
	n.targets = []Target{coreTenant("a", "/kubepods/pod1/ctr-a", 30), coreTenant("b", "/kubepods/pod2/ctr-b", 30)}
	m.run(11, "/kubepods/pod1/ctr-a", 80)
	m.run(21, "/kubepods/pod2/ctr-b", 38) // over the limit, within the margin
	e := m.enforcer(Config{})

	n.passes(e, 9*time.Second)
	if len(n.events) != 0 {
		t.Fatalf("events within the window: %q", n.events)
	}
	n.passes(e, 2*time.Second)
	if n.actions["report/over-core-limit"] != 1 || len(n.events) != 1 ||
		!strings.HasPrefix(n.events[0], "pod-a VGPUCoreLimitExceeded: the processes of container app kept 80% of GPU "+gpuA+"'s SMs busy over the last 10s, over the claim's core limit of 30% (margin 10 points)") {
		t.Fatalf("after the window: actions %v, events %q; want one report of a", n.actions, n.events)
	}
	n.passes(e, 30*time.Second)
	if n.actions["report/over-core-limit"] != 1 || m.everFrozen() || len(n.killed) != 0 {
		t.Fatalf("later passes: actions %v, freezes %v, killed %v; want the one report, nothing frozen or killed", n.actions, m.freezes, n.killed)
	}
	// Back under the limit ends the episode; the next excursion is a new one.
	m.demand[11] = 20
	n.passes(e, 12*time.Second)
	m.demand[11] = 90
	n.passes(e, 12*time.Second)
	if n.actions["report/over-core-limit"] != 2 {
		t.Errorf("a second excursion: actions %v, want a second report", n.actions)
	}
}

// TestThrottleHoldsTheCoreLimit measures how well the throttle holds a container to its core
// limit on the simulated SMs: each shape (limit, what the container wants, NVML's noise) runs
// two minutes of passes; once throttled, the utilisation over the last minute must be within
// the margin above the limit and not starve the container below it by more than 5 points.
func TestThrottleHoldsTheCoreLimit(t *testing.T) {
	for _, tc := range []struct {
		limit         uint32
		demand, noise float64
	}{
		{10, 100, 0}, {10, 100, 5}, {30, 100, 5}, {30, 60, 5}, {50, 100, 8}, {70, 95, 5}, {25, 45, 10},
	} {
		t.Run(fmt.Sprintf("limit%d-demand%.0f-noise%.0f", tc.limit, tc.demand, tc.noise), func(t *testing.T) {
			n, m := oneCoreTenant(tc.noise, tc.limit, tc.demand)
			e := m.enforcer(Config{Cores: CoreThrottle})
			m.average(e, time.Minute, 11)
			got := m.average(e, time.Minute, 11)
			limit := float64(tc.limit)
			t.Logf("limit %.0f%%, wants %.0f%%, noise ±%.0f: %.1f%% over the second minute", limit, tc.demand, tc.noise, got)
			if got > limit+DefaultCoreMargin || got < limit-5 {
				t.Errorf("throttled utilisation %.1f%%, want %.0f%% (at most +%d, at least -5)", got, limit, DefaultCoreMargin)
			}
			if n.actions["throttle/over-core-limit"] != 1 || len(n.events) != 1 || !strings.Contains(n.events[0], "VGPUCoreLimitExceeded: vgpu-dra is throttling container app") {
				t.Errorf("actions %v, events %q; want one throttle with its event", n.actions, n.events)
			}
		})
	}
}

func TestThrottleEndsWhenBackUnder(t *testing.T) {
	n, m := oneCoreTenant(3, 30, 90)
	e := m.enforcer(Config{Cores: CoreThrottle})
	n.passes(e, 20*time.Second)
	if !slices.Contains(m.freezes, "/kubepods/pod1/ctr-a frozen") || n.throttled != 1 {
		t.Fatalf("freezes %v, throttled gauge %d: never throttled", m.freezes, n.throttled)
	}
	m.demand[11] = 15
	n.passes(e, 10*time.Second)
	m.freezes = nil
	n.passes(e, 30*time.Second)
	if slices.Contains(m.freezes, "/kubepods/pod1/ctr-a frozen") {
		t.Errorf("still frozen after it went back under its limit: %v", m.freezes)
	}
	if n.throttled != 0 {
		t.Errorf("throttled gauge %d after the episode, want 0", n.throttled)
	}
}

func TestCoresWithinLimitOrUnlimitedUntouched(t *testing.T) {
	n := newNode()
	m := newSMModel(n, DefaultPeriod, 5)
	unlimited := tenant("u", "/kubepods/pod3/ctr-u", 8*GiB) // no core limit: the whole GPU's SMs
	n.targets = []Target{coreTenant("a", "/kubepods/pod1/ctr-a", 30), unlimited}
	m.run(11, "/kubepods/pod1/ctr-a", 28)
	m.run(12, "/kubepods/pod1/ctr-a", 2) // two processes: 30 together
	m.run(31, "/kubepods/pod3/ctr-u", 100)
	e := m.enforcer(Config{Cores: CoreThrottle})
	n.passes(e, time.Minute)
	if len(n.actions) != 0 || len(n.events) != 0 || m.everFrozen() {
		t.Errorf("actions %v, events %q, freezes %v; want none", n.actions, n.events, m.freezes)
	}
}

// TestThrottleSumsTheContainersProcesses: four processes of one container, each within the
// limit alone, together over it: the container is throttled.
func TestThrottleSumsTheContainersProcesses(t *testing.T) {
	n := newNode()
	m := newSMModel(n, DefaultPeriod, 2)
	n.targets = []Target{coreTenant("a", "/kubepods/pod1/ctr-a", 20)}
	for pid := 11; pid <= 14; pid++ {
		m.run(pid, "/kubepods/pod1/ctr-a", 18)
	}
	e := m.enforcer(Config{Cores: CoreThrottle})
	n.passes(e, time.Minute)
	sum := m.average(e, time.Minute, 11, 12, 13, 14)
	if n.actions["throttle/over-core-limit"] != 1 || sum > 20+DefaultCoreMargin {
		t.Errorf("actions %v, the container's four processes at %.1f%% together; want throttled to 20%%", n.actions, sum)
	}
}

// TestKillThawsFirst: a throttled container over its memory limit is thawed before its
// processes are killed (a frozen process dies only once thawed on cgroup v1).
func TestKillThawsFirst(t *testing.T) {
	n, m := oneCoreTenant(0, 30, 100)
	n.registered[11] = true
	e := m.enforcer(Config{Cores: CoreThrottle})
	n.passes(e, 15*time.Second)
	var order []string
	e.deps.After = func(time.Duration, func()) {} // the thaw after this freeze has not come yet
	e.deps.Freeze = func(cg string, frozen bool) error {
		order = append(order, fmt.Sprintf("freeze %v", frozen))
		return nil
	}
	kill := e.deps.Kill
	e.deps.Kill = func(pid int, cg string) error {
		order = append(order, "kill")
		return kill(pid, cg)
	}
	n.passes(e, time.Second)
	n.hold(gpuA, 11, "/kubepods/pod1/ctr-a", 12*GiB)
	n.passes(e, 2*time.Second)
	k := slices.Index(order, "kill")
	if k < 1 || order[k-1] != "freeze false" {
		t.Errorf("freezer and kill calls %v: want a thaw right before the kill", order)
	}
}

// TestThawSweepAndRelease: an instance thaws each vGPU cgroup it samples once when it begins
// to own the node (a predecessor may have died with it frozen), and thaws what it throttles
// when it stops owning the node.
func TestThawSweepAndRelease(t *testing.T) {
	n := newNode()
	m := newSMModel(n, DefaultPeriod, 0)
	n.targets = []Target{coreTenant("a", "/kubepods/pod1/ctr-a", 30), coreTenant("b", "/kubepods/pod2/ctr-b", 90)}
	m.run(11, "/kubepods/pod1/ctr-a", 100)
	m.run(21, "/kubepods/pod2/ctr-b", 10)
	e := m.enforcer(Config{Cores: CoreThrottle})
	n.passes(e, time.Second)
	if want := []string{"/kubepods/pod1/ctr-a thawed", "/kubepods/pod2/ctr-b thawed"}; !slices.Equal(m.freezes, want) {
		t.Fatalf("the first second's freezer writes %v, want the sweep %v", m.freezes, want)
	}
	n.passes(e, 15*time.Second)
	m.freezes = nil
	n.ready = false
	n.passes(e, time.Second)
	if !slices.Equal(m.freezes, []string{"/kubepods/pod1/ctr-a thawed"}) {
		t.Errorf("after losing the node: %v, want a thawed once, nothing frozen", m.freezes)
	}
	m.freezes = nil
	n.ready = true
	n.passes(e, 0)
	if !slices.Contains(m.freezes, "/kubepods/pod2/ctr-b thawed") {
		t.Errorf("owning the node again: %v, want a new sweep", m.freezes)
	}
}

func TestCoreOffReadsNothing(t *testing.T) {
	n, m := oneCoreTenant(0, 30, 100)
	e := m.enforcer(Config{Cores: CoreOff})
	n.passes(e, 20*time.Second)
	if m.reads != 0 || len(n.actions) != 0 {
		t.Errorf("core enforcement off: %d utilisation reads, actions %v", m.reads, n.actions)
	}
}

func TestParseCoreMode(t *testing.T) {
	for _, s := range []string{"report", "throttle", "off"} {
		if m, err := ParseCoreMode(s); err != nil || string(m) != s {
			t.Errorf("ParseCoreMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseCoreMode("kill"); err == nil || !strings.Contains(err.Error(), "want report, throttle or off") {
		t.Errorf("ParseCoreMode(kill): %v", err)
	}
}
