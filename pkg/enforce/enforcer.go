package enforce

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/arbiter"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// Reasons of an action (label "reason" of enforcement_actions_total; contract §15).
const (
	// ReasonOverLimit: the container's processes held more than its limit (plus the slack)
	// on one GPU for longer than the grace.
	ReasonOverLimit = "over-limit"
	// ReasonUnregistered: a process of a vGPU container held GPU memory for longer than the
	// grace without ever having registered with the node's registry (libvgpu.so was not
	// loaded, or was bypassed).
	ReasonUnregistered = "unregistered"
	// ReasonForeign: a process that belongs to no vGPU container of this node held memory on a
	// GPU this node shares.
	ReasonForeign = "foreign"
)

// Actions (label "action").
const (
	ActionKill   = "kill"
	ActionReport = "report"
)

// Target is what the enforcer holds to its limits: one vGPU container on the NRI path, the
// containers of one claim on the per-claim path, the containers of one pod that hold shares in
// device-plugin mode.
type Target struct {
	// Key identifies the target across passes (the container ID; "claim/<UID>"; "pod/<UID>").
	Key string
	// Namespace, Pod, Container and Claim name it in logs, events and metrics; PodUID is the
	// pod the events go to (empty: none).
	Namespace, Pod, PodUID, Container, Claim string
	// Cgroups are its cgroups, in the hierarchy that Deps.CgroupOf answers in: a process at
	// or below one of them is the target's.
	Cgroups []string
	// Pods are the UIDs of pods whose containers' processes are the target's when no cgroup of
	// any target holds them (the per-claim path: a claim's containers share its limits, and
	// which of a pod's containers use it is not recorded anywhere a restart keeps; the device
	// plugin's pods).
	Pods []string
	// WakeDir is its host core-limit directory, where its library signals work after an idle
	// spell (core.wake, contract §16); empty: its wakes are not watched.
	WakeDir string
	// ConfigDir is the host config directory whose pids.config records the processes that
	// registered with an earlier plugin instance (Deps.Registered). ConfigDirs are more, for a
	// target of several containers with one each (a device-plugin pod whose containers hold
	// shares): a process is registered when one of them says so.
	ConfigDir  string
	ConfigDirs []string
	// Limits is the memory the target may hold on each GPU (UUID → bytes). A GPU that is in
	// neither Limits nor Unlimited is one the target was not given: it may hold nothing there.
	Limits map[string]uint64
	// Unlimited are the GPUs the target uses without a memory limit (admin access, a whole GPU).
	Unlimited map[string]bool
	// CoreLimits is the share of each GPU's SMs, in percent, the target may keep busy (UUID →
	// 1-99); a GPU without one has no core limit (the whole GPU, admin access, no claim).
	CoreLimits map[string]uint32
	// CoreCeilings are the most of each GPU the target may burst to when others leave it idle
	// (contract §16; UUID → percent, at least its CoreLimits there); none: its core limit.
	// BestEffort are the GPUs where its share is best-effort, not guaranteed.
	CoreCeilings map[string]uint32
	BestEffort   map[string]bool
	// MustRegister: its processes register with the registry before they use a GPU (every
	// target with a limit: libvgpu.so registers before it lets CUDA initialise).
	MustRegister bool
}

// Recorder receives the enforcer's figures (pkg/metrics.EnforcementMetrics); may be nil.
type Recorder interface {
	// Action counts one action on one target and GPU (or one foreign process).
	Action(action, reason string)
	// Reaction records the time from the first sample that showed a violation to the kill.
	Reaction(time.Duration)
	// Pass records one pass's duration.
	Pass(time.Duration)
	// Foreign sets the number of foreign processes the last pass saw.
	Foreign(int)
	// ReadError counts a failed read of a GPU's processes.
	ReadError()
	// Throttled sets the number of containers (and GPUs) being throttled after the last pass.
	Throttled(int)
}

// Deps are where the enforcer's view of the node comes from and how it acts; the plugin
// supplies adapters, tests fakes.
type Deps struct {
	// Ready reports whether the node's view is complete: this instance owns the node and the
	// NRI cache has had its first Synchronize. Before that every process would look foreign:
	// a pass does nothing.
	Ready func() bool
	// GPUs lists the UUIDs of the GPUs this node shares.
	GPUs func() []string
	// Targets lists the node's vGPU containers and claims.
	Targets func() []Target
	// Processes lists the processes that hold memory on a GPU (NVML's compute processes).
	Processes func(uuid string) ([]gpu.ProcessMemory, error)
	// CgroupOf returns the process's cgroup; an error when the process is gone.
	CgroupOf func(pid int) (string, error)
	// Registered reports whether the process registered with the node's registry (configDir:
	// the target's, see Target.ConfigDir).
	Registered func(pid int, configDir string) bool
	// PodOf returns the pod UID of a container cgroup (registry.PodOfCgroup); nil: no target
	// is matched by pod.
	PodOf func(cgroup string) (string, bool)
	// Kill kills the process if it is still in cgroup (a reused PID is never signalled). An
	// error wrapping ErrGone means it had already exited.
	Kill func(pid int, cgroup string) error
	// Event raises a Warning event on the target's pod; may be nil.
	Event func(t Target, reason, message string)
	// ForeignEvent raises a Warning event for a foreign process whose pod is known; may be nil.
	ForeignEvent func(pid int, cgroup, message string)
	// Utilization reads NVML's per-process SM utilisation samples of a GPU newer than since
	// (gpu.Source.ProcessUtilization); nil: compute is not enforced.
	Utilization func(uuid string, since uint64) ([]gpu.ProcessSample, error)
	// Freeze freezes or thaws a cgroup (CgroupFreezer.Freeze); nil: compute is only reported.
	Freeze func(cgroup string, frozen bool) error
	// Arbiter divides each GPU's cores between its targets every compute pass (pkg/arbiter,
	// contract §16): a target's allowance then replaces its core limit in the compute rule, and
	// is published in its config directory for the library. Nil: each target's limit is its
	// CoreLimits.
	Arbiter *arbiter.Arbiter
	Metrics Recorder
	// Now is the clock; time.Now when nil. After runs f after d (time.AfterFunc when nil):
	// the thaw of a throttled container.
	Now   func() time.Time
	After func(d time.Duration, f func())
}

// AllRegistered is Deps.Registered on a node without libvgpu.so installed: no container gets the
// library, so no process can register, and the unregistered rule would kill every GPU process of
// every vGPU container. The enforcer then holds containers to their memory limits alone.
func AllRegistered(int, string) bool { return true }

// ErrGone is wrapped by Deps.Kill's error for a process that had already exited.
var ErrGone = errors.New("the process is gone")

// Enforcer holds the node's vGPU containers to their memory limits. Pass is not safe for
// concurrent use; Run calls it from one goroutine.
type Enforcer struct {
	cfg  Config
	deps Deps

	mu sync.Mutex
	// episodes are the violations in progress, by target key, GPU and reason (or PID and GPU
	// for a foreign process). One is dropped when a pass no longer sees it.
	episodes map[episodeKey]*episode
	// cgroups caches each listed process's cgroup while NVML keeps listing it, re-read every
	// cgroupRefresh passes: a process does not change containers, and a PID reused in
	// between is caught by that re-read and, before any kill, by Kill's own check.
	cgroups map[int]cachedCgroup
	passes  uint64

	// compute is the compute rule's history, by target and GPU; utilSince the newest NVML
	// utilisation sample seen per GPU; thawed the cgroups swept since this instance began to
	// own the node, with the pass that last saw them (sweepThaw).
	compute   map[computeKey]*coreState
	utilSince map[string]uint64
	thawed    map[string]uint64
	// interval is how far apart passes really come, lastPass the latest's start (tick).
	interval time.Duration
	lastPass time.Time
}

type cachedCgroup struct {
	cgroup   string
	readAt   uint64 // pass of the read
	seenPass uint64
}

// cgroupRefresh is how many passes a cached cgroup is used before it is read again (4 s at the
// default period).
const cgroupRefresh = 16

type episodeKey struct {
	target, gpu, reason string
	pid                 int // foreign processes only
}

type episode struct {
	since  time.Time
	acted  bool // the kill (or report) was done once: later passes repeat only the kill
	seen   bool // seen by the current pass
	target Target
}

// New returns an enforcer; Run starts it.
func New(cfg Config, deps Deps) *Enforcer {
	cfg.setDefaults()
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.After == nil {
		deps.After = func(d time.Duration, f func()) { time.AfterFunc(d, f) }
	}
	return &Enforcer{cfg: cfg, deps: deps, episodes: map[episodeKey]*episode{}, cgroups: map[int]cachedCgroup{},
		compute: map[computeKey]*coreState{}, utilSince: map[string]uint64{}}
}

// Config is the configuration in force, defaults filled in.
func (e *Enforcer) Config() Config { return e.cfg }

// Run makes a memory pass every period and a compute pass every core period until ctx ends.
func (e *Enforcer) Run(ctx context.Context) {
	t := time.NewTicker(e.cfg.Period)
	defer t.Stop()
	var cores <-chan time.Time
	var wakes <-chan struct{}
	if e.computes() {
		ct := time.NewTicker(e.cfg.CorePeriod)
		defer ct.Stop()
		cores = ct.C
		if e.deps.Arbiter != nil {
			wakes = e.deps.Arbiter.Kicks()
		}
	}
	for {
		select {
		case <-ctx.Done():
			e.mu.Lock()
			e.releaseCompute()
			e.mu.Unlock()
			return
		case <-t.C:
			e.pass(ctx, true, false)
		case <-cores:
			e.pass(ctx, false, true)
		case <-wakes:
			// A guaranteed share woke (contract §16): its GPUs are divided again now, in this
			// goroutine, where the passes divide.
			e.deps.Arbiter.Redivide()
		}
	}
}

// computes: the compute pass reads utilisation (the rule is not off, or an arbiter divides).
func (e *Enforcer) computes() bool {
	return e.deps.Utilization != nil && (e.cfg.Cores != CoreOff || e.deps.Arbiter != nil)
}

// usage is one target's processes on one GPU in the current pass.
type usage struct {
	target       *Target
	bytes        uint64
	pids         []int
	cgroups      []string // of each PID
	unregistered []int
}

// Pass makes a memory pass and a compute pass at once (tests; Run makes them on their periods).
func (e *Enforcer) Pass(ctx context.Context) { e.pass(ctx, true, true) }

// pass reads every served GPU once and acts on what it finds: the processes' memory, their SM
// utilisation, or both.
func (e *Enforcer) pass(ctx context.Context, memory, compute bool) {
	compute = compute && e.computes()
	e.mu.Lock()
	defer e.mu.Unlock()
	start := e.deps.Now()
	logger := klog.FromContext(ctx)
	if e.deps.Ready != nil && !e.deps.Ready() {
		clear(e.episodes)
		clear(e.cgroups)
		e.releaseCompute()
		return
	}
	if memory {
		e.passes++
	}
	if compute {
		e.tick(start)
	}
	targets := e.deps.Targets()
	owner := indexCgroups(targets, e.deps.PodOf)
	foreign := 0
	for _, uuid := range e.deps.GPUs() {
		if compute {
			e.computePass(logger, start, uuid, targets, owner)
		}
		if !memory {
			continue
		}
		procs, err := e.deps.Processes(uuid)
		if err != nil {
			if e.deps.Metrics != nil {
				e.deps.Metrics.ReadError()
			}
			logger.V(4).Info("Cannot list a GPU's processes", "gpu", uuid, "err", err)
			continue
		}
		byTarget := map[string]*usage{}
		var order []*usage
		for _, p := range procs {
			if !p.Known {
				// NVML cannot tell what it holds (NVML_VALUE_NOT_AVAILABLE; a simulated GPU's
				// own processes): nothing is decided on it, it is neither counted nor killed.
				continue
			}
			cg, ok := e.cgroupOf(p.PID)
			if !ok {
				continue // exited since NVML listed it
			}
			t := owner.match(cg, uuid)
			if t == nil {
				foreign++
				e.foreign(logger, start, uuid, p, cg)
				continue
			}
			u := byTarget[t.Key]
			if u == nil {
				u = &usage{target: t}
				byTarget[t.Key] = u
				order = append(order, u)
			}
			u.bytes += p.UsedBytes
			u.pids = append(u.pids, p.PID)
			u.cgroups = append(u.cgroups, cg)
			if t.MustRegister && p.UsedBytes > 0 && !e.registered(p.PID, t) {
				u.unregistered = append(u.unregistered, p.PID)
			}
		}
		for _, u := range order {
			e.check(logger, start, uuid, u)
		}
	}
	if compute {
		e.endCompute()
		if e.deps.Arbiter != nil {
			e.deps.Arbiter.EndPass()
		}
	}
	if !memory {
		return
	}
	for k, ep := range e.episodes {
		if !ep.seen {
			delete(e.episodes, k)
		}
		ep.seen = false
	}
	for pid, c := range e.cgroups {
		if c.seenPass != e.passes {
			delete(e.cgroups, pid)
		}
	}
	if e.deps.Metrics != nil {
		e.deps.Metrics.Foreign(foreign)
		e.deps.Metrics.Pass(e.deps.Now().Sub(start))
	}
}

// cgroupOf is the process's cgroup, from the cache or read.
func (e *Enforcer) cgroupOf(pid int) (string, bool) {
	c, ok := e.cgroups[pid]
	if !ok || e.passes-c.readAt >= cgroupRefresh {
		cg, err := e.deps.CgroupOf(pid)
		if err != nil {
			delete(e.cgroups, pid)
			return "", false
		}
		c = cachedCgroup{cgroup: cg, readAt: e.passes}
	}
	c.seenPass = e.passes
	e.cgroups[pid] = c
	return c.cgroup, true
}

// registered asks Deps.Registered with each of the target's config directories.
func (e *Enforcer) registered(pid int, t *Target) bool {
	if e.deps.Registered(pid, t.ConfigDir) {
		return true
	}
	for _, dir := range t.ConfigDirs {
		if e.deps.Registered(pid, dir) {
			return true
		}
	}
	return false
}

// check compares one target's use of one GPU with its limit.
func (e *Enforcer) check(logger logr.Logger, now time.Time, uuid string, u *usage) {
	t := u.target
	if len(u.unregistered) > 0 {
		msg := fmt.Sprintf("%s of container %s held memory on GPU %s without having registered with the node's registry (libvgpu.so was not loaded or was bypassed)",
			pidList(u.unregistered), t.Container, uuid)
		if e.violation(logger, now, episodeKey{target: t.Key, gpu: uuid, reason: ReasonUnregistered}, *t, u, msg) {
			return // the same processes are killed: one action, one event
		}
	}
	if t.Unlimited[uuid] {
		return
	}
	limit := t.Limits[uuid]
	allowed := limit + uint64(e.cfg.SlackPerProcess)*uint64(len(u.pids))
	if u.bytes <= allowed {
		return
	}
	msg := fmt.Sprintf("the processes of container %s hold %d MiB on GPU %s, over the claim's limit of %d MiB (with %d MiB of context slack for %s)",
		t.Container, u.bytes>>20, uuid, limit>>20, (allowed-limit)>>20, countProcesses(len(u.pids)))
	e.violation(logger, now, episodeKey{target: t.Key, gpu: uuid, reason: ReasonOverLimit}, *t, u, msg)
}

// graceOver says whether an episode seen first at since has lasted the grace by the pass at
// now. Passes come a period apart, give or take the ticker's and the scheduler's jitter: the pass
// due at the grace's end counts even when it starts a little early (within a quarter period),
// or every reaction would take a period more than it should.
func (e *Enforcer) graceOver(now, since time.Time) bool {
	return now.Sub(since)+e.cfg.Period/4 >= e.cfg.Grace
}

// violation records that the episode goes on and, past the grace, kills the target's
// processes on the GPU: once with the event, the count and the log line, and again in later
// passes for any that survived. It reports whether it killed.
func (e *Enforcer) violation(logger logr.Logger, now time.Time, key episodeKey, t Target, u *usage, msg string) bool {
	ep := e.episodes[key]
	if ep == nil {
		ep = &episode{since: now, target: t}
		e.episodes[key] = ep
	}
	ep.seen = true
	if !e.graceOver(now, ep.since) {
		return false
	}
	e.thawTarget(t.Key)
	killed, failed := e.killAll(u.pids, u.cgroups)
	if ep.acted {
		return true
	}
	ep.acted = true
	if e.deps.Metrics != nil {
		e.deps.Metrics.Action(ActionKill, key.reason)
		e.deps.Metrics.Reaction(now.Sub(ep.since))
	}
	log := logger.WithValues("pod", klog.KRef(t.Namespace, t.Pod), "container", t.Container, "claim", t.Claim, "gpu", key.gpu, "reason", key.reason)
	if failed != nil {
		log.Error(failed, "Killing a vGPU container's processes on a GPU failed in part", "violation", msg, "killed", killed)
	} else {
		log.Info("Killed a vGPU container's processes on a GPU", "violation", msg, "killed", killed, "after", now.Sub(ep.since))
	}
	if e.deps.Event != nil {
		e.deps.Event(t, reasonEvent(key.reason), fmt.Sprintf("vgpu-dra killed %s on GPU %s: %s", pidList(killed), key.gpu, msg))
	}
	return true
}

// foreign handles a process of no vGPU container on a served GPU: reported once when first
// seen (PolicyReport), or killed once it has held memory for the grace (PolicyKill).
func (e *Enforcer) foreign(logger logr.Logger, now time.Time, uuid string, p gpu.ProcessMemory, cg string) {
	key := episodeKey{gpu: uuid, reason: ReasonForeign, pid: p.PID}
	ep := e.episodes[key]
	if ep == nil {
		ep = &episode{since: now}
		e.episodes[key] = ep
	}
	ep.seen = true
	var action, msg string
	switch {
	case e.cfg.Foreign == PolicyKill && e.graceOver(now, ep.since):
		killed, failed := e.killAll([]int{p.PID}, []string{cg})
		if ep.acted {
			return
		}
		action = ActionKill
		msg = fmt.Sprintf("vgpu-dra killed process %d: it held memory on GPU %s, which vgpu-dra shares, and belongs to no vGPU container", p.PID, uuid)
		logger.Info("Killed a process of no vGPU container on a shared GPU (--foreign-gpu-process=kill)", "pid", p.PID, "cgroup", cg, "gpu", uuid, "killed", len(killed) > 0, "err", failed)
	case e.cfg.Foreign == PolicyReport && !ep.acted:
		action = ActionReport
		msg = fmt.Sprintf("process %d holds memory on GPU %s, which vgpu-dra shares, and belongs to no vGPU container: the GPU's shares are not what the scheduler counted", p.PID, uuid)
		logger.Info("A process of no vGPU container holds memory on a shared GPU (--foreign-gpu-process=report)", "pid", p.PID, "cgroup", cg, "gpu", uuid, "usedBytes", p.UsedBytes, "known", p.Known)
	default:
		return
	}
	ep.acted = true
	if e.deps.Metrics != nil {
		e.deps.Metrics.Action(action, ReasonForeign)
	}
	if e.deps.ForeignEvent != nil {
		e.deps.ForeignEvent(p.PID, cg, msg)
	}
}

// killAll kills each process that is still in the cgroup it was seen in.
func (e *Enforcer) killAll(pids []int, cgroups []string) (killed []int, failed error) {
	for i, pid := range pids {
		err := e.deps.Kill(pid, cgroups[i])
		switch {
		case err == nil:
			killed = append(killed, pid)
		case errors.Is(err, ErrGone):
		default:
			failed = errors.Join(failed, err)
		}
	}
	return killed, failed
}

// reasonEvent is the event reason for an action's reason.
func reasonEvent(reason string) string {
	switch reason {
	case ReasonOverLimit:
		return "VGPUMemoryLimitExceeded"
	case ReasonUnregistered:
		return "VGPUUnregisteredProcess"
	}
	return "VGPUForeignProcess"
}

func countProcesses(n int) string {
	if n == 1 {
		return "1 process"
	}
	return fmt.Sprintf("%d processes", n)
}

func pidList(pids []int) string {
	if len(pids) == 0 {
		return "no process"
	}
	parts := make([]string, len(pids))
	for i, p := range pids {
		parts[i] = fmt.Sprint(p)
	}
	word := "process "
	if len(pids) > 1 {
		word = "processes "
	}
	return word + strings.Join(parts, ", ")
}

// cgroupIndex finds the target a process belongs to: the one whose cgroup is the process's or
// its nearest ancestor, else one that holds the process's pod (per-claim targets), preferring
// one that was given the GPU.
type cgroupIndex struct {
	byCgroup map[string]*Target
	byPod    map[string][]*Target
	podOf    func(string) (string, bool)
}

func indexCgroups(targets []Target, podOf func(string) (string, bool)) cgroupIndex {
	idx := cgroupIndex{byCgroup: make(map[string]*Target, len(targets)), byPod: map[string][]*Target{}, podOf: podOf}
	for i := range targets {
		for _, cg := range targets[i].Cgroups {
			if cg != "" && cg != "/" {
				idx.byCgroup[cg] = &targets[i]
			}
		}
		for _, pod := range targets[i].Pods {
			idx.byPod[pod] = append(idx.byPod[pod], &targets[i])
		}
	}
	return idx
}

func (idx cgroupIndex) match(cg, uuid string) *Target {
	for c := cg; c != "" && c != "/" && c != "."; {
		if t := idx.byCgroup[c]; t != nil {
			return t
		}
		i := strings.LastIndexByte(c, '/')
		if i < 0 {
			break
		}
		c = c[:i]
	}
	if idx.podOf == nil || len(idx.byPod) == 0 {
		return nil
	}
	pod, ok := idx.podOf(cg)
	if !ok {
		return nil
	}
	candidates := idx.byPod[pod]
	for _, t := range candidates {
		if _, limited := t.Limits[uuid]; limited || t.Unlimited[uuid] {
			return t
		}
	}
	if len(candidates) > 0 {
		return candidates[0]
	}
	return nil
}
