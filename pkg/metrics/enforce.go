package metrics

import (
	"time"

	"k8s.io/component-base/metrics"
)

// EnforcementMetrics are the node-side enforcer's (pkg/enforce, contract §8 and §15). They
// implement enforce.Recorder.
type EnforcementMetrics struct {
	// Actions counts the enforcer's actions: one per container (or foreign process) and GPU
	// and violation, by action (kill, report) and reason (over-limit, unregistered, foreign).
	Actions *metrics.CounterVec
	// ReactionSeconds is the time from the first pass that saw a violation to the kill.
	ReactionSeconds *metrics.Histogram
	// PassSeconds is the time one pass over every served GPU takes.
	PassSeconds *metrics.Histogram
	// ForeignProcesses is the number of processes of no vGPU container on served GPUs in the
	// latest pass.
	ForeignProcesses *metrics.Gauge
	// ReadErrors counts failed reads of a GPU's processes.
	ReadErrors *metrics.Counter
	// ThrottledContainers is the number of containers (per GPU) the compute rule is throttling.
	ThrottledContainers *metrics.Gauge
	// ArbiterWakes counts the containers' wakes (contract §16) by result: taken, dropped
	// (within 10 ms of the container's last), unknown (no target).
	ArbiterWakes *metrics.CounterVec
}

// NewEnforcementMetrics creates the enforcer's metrics and registers them on reg.
func NewEnforcementMetrics(reg metrics.KubeRegistry) *EnforcementMetrics {
	m := &EnforcementMetrics{
		Actions: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "enforcement_actions_total",
			Help:           "Actions of the node-side enforcer, one per container or foreign process, GPU and violation: processes killed (action kill), a violation reported (action report) or a container throttled (action throttle), by reason (over-limit, unregistered, foreign, over-core-limit).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"action", "reason"}),
		// The grace (750 ms) plus at most a period (250 ms) with the defaults: 50 ms to ~100 s.
		ReactionSeconds: metrics.NewHistogram(&metrics.HistogramOpts{
			Namespace: Namespace, Name: "enforcement_reaction_seconds",
			Help:           "Time from the enforcer's first sample that showed a violation to the kill of the processes.",
			Buckets:        metrics.ExponentialBuckets(0.05, 2, 12),
			StabilityLevel: metrics.ALPHA,
		}),
		PassSeconds: metrics.NewHistogram(&metrics.HistogramOpts{
			Namespace: Namespace, Name: "enforcement_pass_duration_seconds",
			Help:           "Time of one pass of the enforcer over every GPU this node shares (NVML's processes, their cgroups), off any request's path.",
			Buckets:        metrics.ExponentialBuckets(0.00001, 2, 16),
			StabilityLevel: metrics.ALPHA,
		}),
		ForeignProcesses: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: Namespace, Name: "enforcement_foreign_processes",
			Help:           "Processes that hold memory on a GPU this node shares and belong to no vGPU container, in the enforcer's latest pass.",
			StabilityLevel: metrics.ALPHA,
		}),
		ReadErrors: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: Namespace, Name: "enforcement_read_errors_total",
			Help:           "Reads of a GPU's processes (NVML) that failed in an enforcer pass.",
			StabilityLevel: metrics.ALPHA,
		}),
		ThrottledContainers: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: Namespace, Name: "enforcement_throttled_containers",
			Help:           "Containers, counted once per GPU, whose cgroups the enforcer is freezing in a duty cycle because their SM utilisation stayed over their core limit (--core-enforcement=throttle), after its latest pass.",
			StabilityLevel: metrics.ALPHA,
		}),
		ArbiterWakes: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "arbiter_wakes_total",
			Help:           "Wakes of the compute arbiter: a container's library said it has work after an idle spell (core.wake), by result: taken (its GPUs divided again at once), dropped (within 10 ms of its last), unknown (no container the last pass divided for).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"result"}),
	}
	reg.MustRegister(m.Actions, m.ReactionSeconds, m.PassSeconds, m.ForeignProcesses, m.ReadErrors, m.ThrottledContainers, m.ArbiterWakes)
	// The kills are 0 from the start, so that the chart's VGPUEnforcerKilledProcesses
	// (increase() over the kill series) sees the first kill of each reason: a series that
	// appears at 1 is no increase to Prometheus.
	for _, reason := range KillReasons {
		m.Actions.WithLabelValues("kill", reason)
	}
	return m
}

// KillReasons are the reasons the enforcer kills for (pkg/enforce's Reason*, which this
// package cannot import): over-limit, unregistered, foreign.
var KillReasons = []string{"over-limit", "unregistered", "foreign"}

// Action counts one action.
func (m *EnforcementMetrics) Action(action, reason string) {
	m.Actions.WithLabelValues(action, reason).Inc()
}

// Reaction records one reaction time.
func (m *EnforcementMetrics) Reaction(d time.Duration) { m.ReactionSeconds.Observe(d.Seconds()) }

// Pass records one pass's duration.
func (m *EnforcementMetrics) Pass(d time.Duration) { m.PassSeconds.Observe(d.Seconds()) }

// Foreign sets the foreign processes of the latest pass.
func (m *EnforcementMetrics) Foreign(n int) { m.ForeignProcesses.Set(float64(n)) }

// ReadError counts one failed read.
func (m *EnforcementMetrics) ReadError() { m.ReadErrors.Inc() }

// Throttled sets the containers being throttled.
func (m *EnforcementMetrics) Throttled(n int) { m.ThrottledContainers.Set(float64(n)) }

// Wake counts one wake of the arbiter by result.
func (m *EnforcementMetrics) Wake(result string) { m.ArbiterWakes.WithLabelValues(result).Inc() }
