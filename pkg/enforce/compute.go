package enforce

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/go-logr/logr"

	"github.com/vgpu-dra/vgpu-dra/pkg/arbiter"
	"k8s.io/klog/v2"
)

// The compute rule (contract §15, "Compute"): a container's SM utilisation on a GPU — the sum of
// NVML's per-process samples of its processes — averaged over CoreWindow, above its core limit
// by more than CoreMargin percentage points, is reported (CoreReport) or throttled
// (CoreThrottle): the cgroups of its processes on that GPU are frozen for a share of every
// period, the duty, until it would stay under the limit without it.
//
// The duty is a feedback loop, not a schedule: each pass estimates what the container would use
// unthrottled (its utilisation over the last second divided by the share of that second it was
// thawed) and moves the duty half-way towards 1 - limit/that, at most maxDuty. A kernel running
// while its process is frozen keeps running — the freezer stops the process's CPU threads, so it
// launches no more work — and one long kernel is therefore not preempted (threat model).

// ReasonOverCoreLimit: the container's processes kept more of a GPU's SMs busy than its core
// limit (plus the margin), averaged over the window.
const ReasonOverCoreLimit = "over-core-limit"

// ActionThrottle: the container's cgroups are frozen in a duty cycle (--core-enforcement=throttle).
const ActionThrottle = "throttle"

// CoreMode is what the enforcer does about sustained SM utilisation above a core limit
// (--core-enforcement).
type CoreMode string

const (
	// CoreReport counts, logs and raises an event once per episode; nothing is slowed down.
	CoreReport CoreMode = "report"
	// CoreThrottle also freezes the container's cgroups in a duty cycle until it is back under.
	CoreThrottle CoreMode = "throttle"
	// CoreOff reads no utilisation at all.
	CoreOff CoreMode = "off"
)

// ParseCoreMode parses the flag's value.
func ParseCoreMode(s string) (CoreMode, error) {
	switch m := CoreMode(s); m {
	case CoreReport, CoreThrottle, CoreOff:
		return m, nil
	}
	return "", fmt.Errorf("%q: want %s, %s or %s", s, CoreReport, CoreThrottle, CoreOff)
}

const (
	// DefaultCoreMargin is how many percentage points a container's average SM utilisation may
	// exceed its core limit by before it is acted on: NVML's per-process samples are coarse
	// (a sample covers the last 1/6 s or so and rounds to whole percent) and the library's
	// token buckets let a burst through at the start of each refill.
	DefaultCoreMargin = 10
	// DefaultCoreWindow is what the average is taken over: long enough that the library's
	// bursts and a kernel that outlasts one refill average out, short enough that a tenant
	// who refills the token file is acted on within seconds.
	DefaultCoreWindow = 10 * time.Second
	// maxDuty is the largest share of a period a container is frozen for: it always runs a
	// little, so its utilisation can be measured and it can make progress.
	maxDuty = 0.95
	// minDuty: a duty below this is no throttle; the episode ends once it falls below while
	// the container would stay under its limit unthrottled.
	minDuty = 0.02
	// estimateSpan is the recent history the unthrottled utilisation is estimated over.
	estimateSpan = time.Second
)

type computeKey struct{ target, gpu string }

// coreSample is one pass's figures for one target on one GPU.
type coreSample struct {
	at    time.Time
	util  float64 // sum of the target's processes' SM utilisation, percent
	limit float64 // its core limit in the pass: the arbiter's allowance, or CoreLimits
	// frozen is how long the target was frozen for after this sample: the duty's share of the
	// interval the enforcer's passes really come at (e.interval), which a loaded node stretches.
	frozen time.Duration
}

// coreState is one target's compute history on one GPU.
type coreState struct {
	target  Target
	samples []coreSample // oldest first, the last CoreWindow of passes
	// sumUtil and sumLimit are the sums over samples, kept as they come and go so that a pass
	// costs the same whatever the window holds (a 10 s window is 100 samples at 100 ms). Both
	// are sums of whole percents, exact in a float64.
	sumUtil, sumLimit float64
	seen              bool

	reported   bool    // this episode was reported (counted, logged, evented)
	throttling bool    // an episode of throttling is in progress
	duty       float64 // the current duty while throttling
	cgroups    []string
}

// computePass reads the GPU's utilisation samples, has the arbiter divide the GPU between the
// targets with a core limit there, and applies the compute rule to them.
func (e *Enforcer) computePass(logger logr.Logger, now time.Time, uuid string, targets []Target, owner cgroupIndex) {
	samples, err := e.deps.Utilization(uuid, e.utilSince[uuid])
	if err != nil {
		if e.deps.Metrics != nil {
			e.deps.Metrics.ReadError()
		}
		logger.V(4).Info("Cannot read a GPU's process utilisation", "gpu", uuid, "err", err)
		return
	}
	type sum struct {
		util    float64
		cgroups []string
	}
	sums := map[string]*sum{}
	for _, s := range samples {
		if s.TimeStamp > e.utilSince[uuid] {
			e.utilSince[uuid] = s.TimeStamp
		}
		cg, ok := e.cgroupOf(s.PID)
		if !ok {
			continue
		}
		t := owner.match(cg, uuid)
		if t == nil {
			continue
		}
		e.sweepThaw(logger, cg)
		if t.CoreLimits[uuid] == 0 {
			continue
		}
		u := sums[t.Key]
		if u == nil {
			u = &sum{}
			sums[t.Key] = u
		}
		u.util += float64(s.SMUtil)
		if !slices.Contains(u.cgroups, cg) {
			u.cgroups = append(u.cgroups, cg)
		}
	}
	limits := e.divide(uuid, targets, func(key string) float64 {
		if u := sums[key]; u != nil {
			return u.util
		}
		return 0
	})
	for i := range targets {
		t := &targets[i]
		u := sums[t.Key]
		if u == nil {
			continue
		}
		k := computeKey{target: t.Key, gpu: uuid}
		st := e.compute[k]
		if st == nil {
			st = &coreState{}
			e.compute[k] = st
		}
		st.target, st.cgroups = *t, u.cgroups
	}
	for k, st := range e.compute {
		if k.gpu != uuid {
			continue
		}
		util := 0.0 // a target without a sample in this pass kept no SM busy
		if u := sums[k.target]; u != nil {
			util = u.util
		}
		limit, ok := limits[k.target]
		if !ok {
			limit = float64(st.target.CoreLimits[uuid])
		}
		st.seen = true
		e.coreCheck(logger, now, k, st, util, limit)
	}
}

// divide is each target's core limit on the GPU in this pass: its allowance when an arbiter
// divides the GPU (every target with a core limit there takes part, idle or not, so that its
// allowance file is kept), else its CoreLimits.
func (e *Enforcer) divide(uuid string, targets []Target, util func(key string) float64) map[string]float64 {
	limits := map[string]float64{}
	var in []arbiter.Input
	for i := range targets {
		t := &targets[i]
		req := t.CoreLimits[uuid]
		if req == 0 {
			continue
		}
		limits[t.Key] = float64(req)
		if e.deps.Arbiter == nil {
			continue
		}
		class := arbiter.Guaranteed
		if t.BestEffort[uuid] {
			class = arbiter.BestEffort
		}
		in = append(in, arbiter.Input{
			Share:      arbiter.Share{Key: t.Key, Class: class, Request: float64(req), Ceiling: float64(max(t.CoreCeilings[uuid], req)), Util: util(t.Key)},
			ConfigDirs: t.configDirs(),
			WakeDirs:   t.wakeDirs(),
		})
	}
	if len(in) > 0 {
		for i, a := range e.deps.Arbiter.Divide(uuid, in) {
			limits[in[i].Key] = a
		}
	}
	return limits
}

// wakeDirs are the directories whose core.wake the arbiter watches for the target.
func (t *Target) wakeDirs() []string {
	if t.WakeDir == "" {
		return nil
	}
	return []string{t.WakeDir}
}

// configDirs are the target's config directories: where its allowance file goes.
func (t *Target) configDirs() []string {
	var out []string
	if t.ConfigDir != "" {
		out = append(out, t.ConfigDir)
	}
	return append(out, t.ConfigDirs...)
}

// coreCheck records the pass's figure and applies the rule.
func (e *Enforcer) coreCheck(logger logr.Logger, now time.Time, k computeKey, st *coreState, util, passLimit float64) {
	util, passLimit = math.Round(util), math.Round(passLimit)
	st.samples = append(st.samples, coreSample{at: now, util: util, limit: passLimit})
	st.sumUtil += util
	st.sumLimit += passLimit
	cut := 0
	for cut < len(st.samples)-1 && now.Sub(st.samples[cut+1].at) >= e.cfg.CoreWindow {
		st.sumUtil -= st.samples[cut].util
		st.sumLimit -= st.samples[cut].limit
		cut++ // keep one sample at or beyond the window's start, so coverage can be told
	}
	st.samples = st.samples[cut:]
	// The limit an average is held to is the average of the limits in force over the window:
	// an allowance that changed (a burst, given and taken back) is held to what it was when.
	avg, limit, covered := st.windowAverage(now, e.cfg.CoreWindow)
	over := covered && avg > limit+float64(e.cfg.CoreMargin)
	log := logger.WithValues("pod", klog.KRef(st.target.Namespace, st.target.Pod), "container", st.target.Container, "claim", st.target.Claim, "gpu", k.gpu)
	msg := func() string {
		return fmt.Sprintf("the processes of container %s kept %.0f%% of GPU %s's SMs busy over the last %s, over the claim's core limit of %.0f%% (margin %d points)",
			st.target.Container, avg, k.gpu, e.cfg.CoreWindow, limit, e.cfg.CoreMargin)
	}
	switch {
	case e.cfg.Cores == CoreThrottle && st.throttling:
		// The duty aims at the limit in force now, not the window's average of it.
		running := st.runningEstimate(now)
		want := 0.0
		if running > passLimit {
			want = math.Min(maxDuty, 1-passLimit/running)
		}
		st.duty += (want - st.duty) / 2
		if st.duty < minDuty && running <= passLimit {
			st.throttling, st.duty = false, 0
			e.freezeAll(st.cgroups, false)
			log.Info("A vGPU container is back under its core limit: no longer throttled", "utilisation", fmt.Sprintf("%.0f%%", running), "limit", fmt.Sprintf("%.0f%%", limit))
			return
		}
		e.throttle(st)
	case e.cfg.Cores == CoreThrottle && over && e.deps.Freeze != nil:
		st.throttling = true
		st.duty = math.Min(maxDuty, 1-limit/math.Max(avg, 1))
		e.act(log, st.target, ActionThrottle, "VGPUCoreLimitExceeded", "vgpu-dra is throttling container "+st.target.Container+": "+msg())
		e.throttle(st)
	case over && !st.reported:
		st.reported = true
		e.act(log, st.target, ActionReport, "VGPUCoreLimitExceeded", msg())
	case !over && avg <= limit:
		st.reported = false
	}
}

// act counts, logs and raises the event of one compute action.
func (e *Enforcer) act(log logr.Logger, t Target, action, event, msg string) {
	if e.deps.Metrics != nil {
		e.deps.Metrics.Action(action, ReasonOverCoreLimit)
	}
	log.Info("A vGPU container's SM utilisation is over its core limit", "action", action, "violation", msg)
	if e.deps.Event != nil {
		e.deps.Event(t, event, msg)
	}
}

// throttle freezes the target's cgroups on the GPU for the duty's share of the interval until
// the next pass.
func (e *Enforcer) throttle(st *coreState) {
	if st.duty < minDuty {
		return
	}
	d := time.Duration(st.duty * float64(e.interval))
	st.samples[len(st.samples)-1].frozen = d
	cgroups := slices.Clone(st.cgroups)
	e.freezeAll(cgroups, true)
	e.deps.After(d, func() { e.freezeAll(cgroups, false) })
}

// tick keeps e.interval, the interval passes really come at: the period, stretched when the
// node is loaded and the enforcer's goroutine runs late. A gap of more than a few periods (the
// node was lost and owned again, a stopped process) is not an interval.
func (e *Enforcer) tick(now time.Time) {
	if e.interval == 0 {
		e.interval = e.cfg.CorePeriod
	}
	if d := now.Sub(e.lastPass); !e.lastPass.IsZero() && d > 0 && d < 4*e.cfg.CorePeriod {
		e.interval += (d - e.interval) / 4
	}
	e.lastPass = now
}

// runningEstimate is what the target would use unthrottled: its utilisation over the last
// estimateSpan divided by the share of that span it was thawed.
func (st *coreState) runningEstimate(now time.Time) float64 {
	var util, thawed float64
	n := 0
	for i := len(st.samples) - 1; i >= 0 && now.Sub(st.samples[i].at) < estimateSpan; i-- {
		util += st.samples[i].util
		if i > 0 {
			// The freeze after the previous sample shaped this one.
			span := st.samples[i].at.Sub(st.samples[i-1].at)
			thawed += 1 - math.Min(1, float64(st.samples[i-1].frozen)/float64(max(span, 1)))
		} else {
			thawed++
		}
		n++
	}
	if n == 0 || thawed <= 0 {
		return 100
	}
	return math.Min(100*float64(n), util/thawed)
}

// windowAverage is the mean utilisation and limit of the samples within window of now, and
// whether the samples cover the whole window: every sample but the oldest is within it
// (coreCheck keeps one at or beyond the window's start).
func (st *coreState) windowAverage(now time.Time, window time.Duration) (util, limit float64, covered bool) {
	n := len(st.samples)
	if n == 0 {
		return 0, 0, false
	}
	u, l := st.sumUtil, st.sumLimit
	covered = now.Sub(st.samples[0].at) >= window
	if covered && n > 1 {
		u -= st.samples[0].util
		l -= st.samples[0].limit
		n--
	} else if covered {
		return 0, 0, true // the one sample is older than the window: nothing within it
	}
	return u / float64(n), l / float64(n), covered
}

// endCompute forgets the states no pass saw (their target is gone, or the GPU no longer
// served), thawing what they froze, and the swept cgroups no pass has seen for a while.
func (e *Enforcer) endCompute() {
	defer func() {
		if e.deps.Metrics != nil {
			n := 0
			for _, st := range e.compute {
				if st.throttling {
					n++
				}
			}
			e.deps.Metrics.Throttled(n)
		}
	}()
	for cg, pass := range e.thawed {
		if e.passes-pass > sweepForget {
			delete(e.thawed, cg)
		}
	}
	for k, st := range e.compute {
		if !st.seen {
			if st.throttling {
				e.freezeAll(st.cgroups, false)
			}
			delete(e.compute, k)
			continue
		}
		st.seen = false
		if !st.throttling && !st.reported && st.sumUtil <= 0 {
			delete(e.compute, k)
		}
	}
}

// sweepForget is how many passes a swept cgroup is remembered after its processes were last
// sampled (a minute at the default period): long enough that a container idle for a while is
// not thawed again in the middle of its own throttling, short enough to bound the set.
const sweepForget = 240

// thawTarget ends any throttling of the target (before its processes are killed: a frozen
// process dies only once thawed on cgroup v1).
func (e *Enforcer) thawTarget(key string) {
	for k, st := range e.compute {
		if k.target == key && st.throttling {
			st.throttling, st.duty = false, 0
			e.freezeAll(st.cgroups, false)
		}
	}
}

// releaseCompute thaws everything this enforcer froze and forgets the history: the instance
// stops owning the node, or stops.
func (e *Enforcer) releaseCompute() {
	for k, st := range e.compute {
		if st.throttling {
			e.freezeAll(st.cgroups, false)
		}
		delete(e.compute, k)
	}
	clear(e.utilSince)
	e.thawed = nil
}

// sweepThaw thaws, once per ownership, each cgroup of a vGPU process the enforcer sees: a
// plugin instance that died, or lost the node, while it had a container frozen cannot thaw
// it; its successor does, the first time it sees the container's processes. No one else
// freezes a container's cgroups (a container cannot write its cgroup files).
func (e *Enforcer) sweepThaw(logger logr.Logger, cg string) {
	if e.deps.Freeze == nil {
		return
	}
	if e.thawed == nil {
		e.thawed = map[string]uint64{}
	}
	_, done := e.thawed[cg]
	e.thawed[cg] = e.passes
	if done {
		return
	}
	if err := e.deps.Freeze(cg, false); err != nil {
		logger.V(4).Info("Cannot make sure a container's cgroup is thawed", "cgroup", cg, "err", err)
	}
}

func (e *Enforcer) freezeAll(cgroups []string, frozen bool) {
	if e.deps.Freeze == nil {
		return
	}
	for _, cg := range cgroups {
		_ = e.deps.Freeze(cg, frozen) // a cgroup that is gone took its processes with it
	}
}
