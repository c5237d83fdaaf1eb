package enforce

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

const (
	gpuA = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	gpuB = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
	MiB  = 1 << 20
	GiB  = 1 << 30
)

// node is a fake node: GPUs with processes, processes in cgroups, registrations, a clock.
type node struct {
	mu         sync.Mutex
	now        time.Time
	ready      bool
	targets    []Target
	procs      map[string][]gpu.ProcessMemory // GPU → processes
	cgroups    map[int]string
	registered map[int]bool
	killed     []int
	events     []string
	actions    map[string]int
	throttled  int
}

func newNode() *node {
	return &node{now: time.Unix(1000, 0), ready: true, procs: map[string][]gpu.ProcessMemory{},
		cgroups: map[int]string{}, registered: map[int]bool{}, actions: map[string]int{}}
}

// hold says that pid, in cgroup cg, holds bytes on the GPU.
func (n *node) hold(uuid string, pid int, cg string, bytes uint64) {
	n.cgroups[pid] = cg
	n.procs[uuid] = slices.DeleteFunc(n.procs[uuid], func(p gpu.ProcessMemory) bool { return p.PID == pid })
	n.procs[uuid] = append(n.procs[uuid], gpu.ProcessMemory{PID: pid, UsedBytes: bytes, Known: true})
}

func (n *node) enforcer(cfg Config) *Enforcer {
	return New(cfg, Deps{
		Ready:   func() bool { return n.ready },
		GPUs:    func() []string { return []string{gpuA, gpuB} },
		Targets: func() []Target { return n.targets },
		Processes: func(uuid string) ([]gpu.ProcessMemory, error) {
			if uuid == "GPU-broken" {
				return nil, fmt.Errorf("NVML says no")
			}
			return slices.Clone(n.procs[uuid]), nil
		},
		CgroupOf: func(pid int) (string, error) {
			if cg, ok := n.cgroups[pid]; ok {
				return cg, nil
			}
			return "", fmt.Errorf("no process %d", pid)
		},
		Registered: func(pid int, _ string) bool { return n.registered[pid] },
		Kill: func(pid int, cg string) error {
			if _, ok := n.cgroups[pid]; !ok {
				return fmt.Errorf("pid %d: %w", pid, ErrGone)
			}
			if n.cgroups[pid] != cg {
				return fmt.Errorf("pid %d moved", pid)
			}
			n.killed = append(n.killed, pid)
			// A killed process's memory is freed: it is gone from every GPU.
			for uuid := range n.procs {
				n.procs[uuid] = slices.DeleteFunc(n.procs[uuid], func(p gpu.ProcessMemory) bool { return p.PID == pid })
			}
			delete(n.cgroups, pid)
			return nil
		},
		Event: func(t Target, reason, message string) {
			n.events = append(n.events, t.Pod+" "+reason+": "+message)
		},
		Metrics: (*recorder)(n),
		Now:     func() time.Time { return n.now },
	})
}

type recorder node

func (r *recorder) Action(action, reason string) { r.actions[action+"/"+reason]++ }
func (r *recorder) Reaction(time.Duration)       {}
func (r *recorder) Pass(time.Duration)           {}
func (r *recorder) Foreign(int)                  {}
func (r *recorder) ReadError()                   {}
func (r *recorder) Throttled(n int)              { r.throttled = n }

// passes runs a pass every period for d.
func (n *node) passes(e *Enforcer, d time.Duration) {
	for end := n.now.Add(d); !n.now.After(end); n.now = n.now.Add(e.cfg.Period) {
		e.Pass(context.Background())
	}
}

func tenant(key, cg string, limit uint64) Target {
	return Target{Key: key, Namespace: "ns", Pod: "pod-" + key, Container: "app", Claim: "claim-" + key,
		Cgroups: []string{cg}, Limits: map[string]uint64{gpuA: limit}, MustRegister: true}
}

func TestOverLimitKilledAfterGrace(t *testing.T) {
	n := newNode()
	n.targets = []Target{tenant("a", "/kubepods/pod1/ctr-a", 1*GiB), tenant("b", "/kubepods/pod2/ctr-b", 1*GiB)}
	// a: two processes that together hold 2.5 GiB; b: within its limit.
	n.hold(gpuA, 11, "/kubepods/pod1/ctr-a", 1536*MiB)
	n.hold(gpuA, 12, "/kubepods/pod1/ctr-a", 1024*MiB)
	n.hold(gpuA, 21, "/kubepods/pod2/ctr-b", 900*MiB)
	n.registered = map[int]bool{11: true, 12: true, 21: true}
	e := n.enforcer(Config{SlackPerProcess: 256 * MiB})

	n.passes(e, DefaultGrace-DefaultPeriod)
	if len(n.killed) != 0 {
		t.Fatalf("killed %v within the grace", n.killed)
	}
	n.passes(e, 250*time.Millisecond)
	if !slices.Equal(n.killed, []int{11, 12}) {
		t.Fatalf("killed %v after the grace, want a's processes 11 and 12", n.killed)
	}
	if len(n.events) != 1 || !strings.HasPrefix(n.events[0], "pod-a VGPUMemoryLimitExceeded: vgpu-dra killed processes 11, 12 on GPU "+gpuA) ||
		!strings.Contains(n.events[0], "hold 2560 MiB") || !strings.Contains(n.events[0], "limit of 1024 MiB (with 512 MiB of context slack for 2 processes)") {
		t.Errorf("events %q", n.events)
	}
	if n.actions["kill/over-limit"] != 1 || len(n.actions) != 1 {
		t.Errorf("actions %v, want one kill for over-limit", n.actions)
	}
	n.passes(e, 5*time.Second)
	if len(n.killed) != 2 || len(n.events) != 1 {
		t.Errorf("later passes: killed %v, events %d; b within its limit must never be touched", n.killed, len(n.events))
	}
}

func TestWithinLimitAndSlackUntouched(t *testing.T) {
	n := newNode()
	n.targets = []Target{tenant("a", "/kubepods/pod1/ctr-a", 1*GiB)}
	// 1 GiB of allocations and a 600 MiB context in each of two processes: 2.2 GiB, under
	// 1 GiB + 2 × 640 MiB.
	n.hold(gpuA, 11, "/kubepods/pod1/ctr-a", 1024*MiB+600*MiB)
	n.hold(gpuA, 12, "/kubepods/pod1/ctr-a", 600*MiB)
	n.registered = map[int]bool{11: true, 12: true}
	e := n.enforcer(Config{})
	n.passes(e, 10*time.Second)
	if len(n.killed) != 0 || len(n.events) != 0 || len(n.actions) != 0 {
		t.Errorf("a container within its limit and the default slack: killed %v, events %v, actions %v", n.killed, n.events, n.actions)
	}
}

// A container that goes back under its limit within the grace starts a new grace next time.
func TestBackUnderResetsGrace(t *testing.T) {
	n := newNode()
	n.targets = []Target{tenant("a", "/kubepods/pod1/ctr-a", 1*GiB)}
	n.registered = map[int]bool{11: true}
	e := n.enforcer(Config{SlackPerProcess: -1})
	for range 5 {
		n.hold(gpuA, 11, "/kubepods/pod1/ctr-a", 2*GiB)
		n.passes(e, 500*time.Millisecond)
		n.hold(gpuA, 11, "/kubepods/pod1/ctr-a", 512*MiB)
		n.passes(e, 250*time.Millisecond)
	}
	if len(n.killed) != 0 {
		t.Errorf("killed %v: each excursion was shorter than the grace", n.killed)
	}
}

func TestUnregisteredProcessKilled(t *testing.T) {
	n := newNode()
	n.targets = []Target{tenant("a", "/kubepods/pod1/ctr-a", 10*GiB)}
	n.hold(gpuA, 11, "/kubepods/pod1/ctr-a", 1*GiB)     // registered, within the limit
	n.hold(gpuA, 13, "/kubepods/pod1/ctr-a/sub", 1*GiB) // a sub-cgroup: still the container's
	n.registered = map[int]bool{11: true}
	e := n.enforcer(Config{})
	n.passes(e, time.Second)
	if !slices.Equal(n.killed, []int{11, 13}) {
		t.Errorf("killed %v, want the container's processes on the GPU", n.killed)
	}
	if len(n.events) != 1 || !strings.Contains(n.events[0], "VGPUUnregisteredProcess") || !strings.Contains(n.events[0], "process 13 of container app held memory on GPU") {
		t.Errorf("events %q", n.events)
	}
	if n.actions["kill/unregistered"] != 1 {
		t.Errorf("actions %v", n.actions)
	}
}

// A target of several containers (a device-plugin pod whose containers hold shares) has a
// config directory each: a process that an earlier instance's pids.config lists in any of them
// is registered; one listed in none is not.
func TestRegisteredInAnyConfigDir(t *testing.T) {
	n := newNode()
	tg := tenant("a", "/kubepods/pod1/ctr-a", 10*GiB)
	tg.ConfigDir, tg.ConfigDirs = "/claims/lead-a/config", []string{"/claims/lead-b/config"}
	n.targets = []Target{tg}
	n.hold(gpuA, 11, "/kubepods/pod1/ctr-a", 1*GiB)
	n.hold(gpuA, 12, "/kubepods/pod1/ctr-a", 1*GiB)
	e := n.enforcer(Config{})
	var asked []string
	e.deps.Registered = func(pid int, dir string) bool {
		asked = append(asked, dir)
		return pid == 11 && dir == "/claims/lead-b/config"
	}
	n.passes(e, time.Second)
	if !slices.Equal(n.killed, []int{11, 12}) || !strings.Contains(strings.Join(n.events, ""), "process 12 of container app held memory") {
		t.Errorf("killed %v, events %q; want the container's processes killed for process 12 alone", n.killed, n.events)
	}
	if !slices.Contains(asked, "/claims/lead-a/config") || !slices.Contains(asked, "/claims/lead-b/config") {
		t.Errorf("config directories asked: %q, want both", asked)
	}
}

// A process that has a context but holds nothing yet is not acted on as unregistered, and one
// whose figure NVML cannot tell is neither counted nor killed: only memory NVML reports is.
func TestUnregisteredNeedsMemory(t *testing.T) {
	n := newNode()
	n.targets = []Target{tenant("a", "/kubepods/pod1/ctr-a", 10*GiB), {Key: "mon", Pod: "monitor", Cgroups: []string{"/kubepods/pod9/mon"},
		Unlimited: map[string]bool{gpuA: true}}}
	n.hold(gpuA, 11, "/kubepods/pod1/ctr-a", 0)
	n.cgroups[12] = "/kubepods/pod1/ctr-a"
	n.procs[gpuA] = append(n.procs[gpuA], gpu.ProcessMemory{PID: 12}) // not available
	n.hold(gpuA, 91, "/kubepods/pod9/mon", 8*GiB)                     // admin access: no registration, no limit
	e := n.enforcer(Config{})
	n.passes(e, 3*time.Second)
	if len(n.killed) != 0 {
		t.Errorf("killed %v", n.killed)
	}
}

// Memory on a GPU the claim does not give is over a limit of nothing.
func TestMemoryOnAnotherGPU(t *testing.T) {
	n := newNode()
	n.targets = []Target{tenant("a", "/kubepods/pod1/ctr-a", 10*GiB)}
	n.hold(gpuB, 11, "/kubepods/pod1/ctr-a", 1*GiB)
	n.registered = map[int]bool{11: true}
	e := n.enforcer(Config{})
	n.passes(e, time.Second)
	if !slices.Equal(n.killed, []int{11}) || !strings.Contains(strings.Join(n.events, ""), "over the claim's limit of 0 MiB") {
		t.Errorf("killed %v, events %q", n.killed, n.events)
	}
}

func TestForeignProcess(t *testing.T) {
	for _, policy := range []Policy{PolicyReport, PolicyKill} {
		t.Run(string(policy), func(t *testing.T) {
			n := newNode()
			n.targets = []Target{tenant("a", "/kubepods/pod1/ctr-a", 10*GiB)}
			n.hold(gpuA, 77, "/system.slice/other.service", 4*GiB)
			e := n.enforcer(Config{Foreign: policy})
			n.passes(e, 2*time.Second)
			wantKilled := 0
			if policy == PolicyKill {
				wantKilled = 1
			}
			if len(n.killed) != wantKilled || n.actions[map[Policy]string{PolicyReport: "report", PolicyKill: "kill"}[policy]+"/foreign"] != 1 {
				t.Errorf("killed %v, actions %v", n.killed, n.actions)
			}
		})
	}
}

// Before the node's view is complete (another instance owns the node, the NRI cache has not
// synchronised), every process would look foreign or unregistered: nothing is done, and the
// grace starts afresh once it is complete.
func TestNotReadyDoesNothing(t *testing.T) {
	n := newNode()
	n.targets = []Target{tenant("a", "/kubepods/pod1/ctr-a", 1*GiB)}
	n.hold(gpuA, 11, "/kubepods/pod1/ctr-a", 4*GiB)
	n.ready = false
	e := n.enforcer(Config{})
	n.passes(e, 5*time.Second)
	if len(n.killed) != 0 || len(n.actions) != 0 {
		t.Fatalf("acted while not ready: killed %v, actions %v", n.killed, n.actions)
	}
	n.ready = true
	n.passes(e, DefaultGrace-DefaultPeriod)
	if len(n.killed) != 0 {
		t.Fatalf("killed %v before a full grace observed while ready", n.killed)
	}
	n.passes(e, 250*time.Millisecond)
	if len(n.killed) != 1 {
		t.Errorf("killed %v after the grace", n.killed)
	}
}

// A process that moved to another cgroup between the pass's read and the kill is not killed.
func TestKillChecksTheCgroup(t *testing.T) {
	n := newNode()
	n.targets = []Target{tenant("a", "/kubepods/pod1/ctr-a", 1*GiB)}
	n.hold(gpuA, 11, "/kubepods/pod1/ctr-a", 4*GiB)
	n.registered = map[int]bool{11: true}
	e := n.enforcer(Config{})
	deps := e.deps
	e.deps.Kill = func(pid int, cg string) error {
		n.cgroups[pid] = "/elsewhere" // reused by another process in between
		return deps.Kill(pid, cg)
	}
	n.passes(e, 2*time.Second)
	if len(n.killed) != 0 {
		t.Errorf("killed %v though the PID's cgroup changed", n.killed)
	}
}

// A per-claim target holds the processes of its pods that no container target holds: the one
// given the GPU among the pod's claims, and nothing of another pod.
func TestPerClaimTargetByPod(t *testing.T) {
	n := newNode()
	n.targets = []Target{
		{Key: "claim/1", Claim: "other-gpu", Pods: []string{"pod1"}, Limits: map[string]uint64{gpuB: 8 * GiB}, MustRegister: true},
		{Key: "claim/2", Claim: "this-gpu", Pods: []string{"pod1"}, Limits: map[string]uint64{gpuA: 1 * GiB}, MustRegister: true},
	}
	n.hold(gpuA, 11, "/kubepods/pod1/ctr-a", 4*GiB)
	n.hold(gpuA, 21, "/kubepods/pod2/ctr-b", 4*GiB) // another pod: foreign, reported
	n.registered = map[int]bool{11: true, 21: true}
	e := n.enforcer(Config{})
	e.deps.PodOf = func(cg string) (string, bool) {
		parts := strings.Split(cg, "/")
		return parts[2], len(parts) > 3
	}
	n.passes(e, time.Second)
	if !slices.Equal(n.killed, []int{11}) || n.actions["kill/over-limit"] != 1 || n.actions["report/foreign"] != 1 {
		t.Errorf("killed %v, actions %v; want pod1's process held to this-gpu's 1 GiB and pod2's reported", n.killed, n.actions)
	}
}

// A process whose memory NVML cannot tell is not killed with its container's others.
func TestUnknownFigureNotKilled(t *testing.T) {
	n := newNode()
	n.targets = []Target{tenant("a", "/kubepods/pod1/ctr-a", 1*GiB)}
	n.hold(gpuA, 11, "/kubepods/pod1/ctr-a", 4*GiB)
	n.cgroups[12] = "/kubepods/pod1/ctr-a"
	n.procs[gpuA] = append(n.procs[gpuA], gpu.ProcessMemory{PID: 12})
	n.registered = map[int]bool{11: true}
	e := n.enforcer(Config{})
	n.passes(e, time.Second)
	if !slices.Equal(n.killed, []int{11}) || !strings.Contains(strings.Join(n.events, ""), "context slack for 1 process") {
		t.Errorf("killed %v, events %q; want only the process NVML reports, with one process's slack", n.killed, n.events)
	}
}
