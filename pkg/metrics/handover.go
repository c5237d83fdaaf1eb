package metrics

import "k8s.io/component-base/metrics"

// Events of the node's ownership (label "event" of handover_events_total, contract §14).
const (
	// EventStarted: the instance found the node free at start-up and owns it.
	EventStarted = "started"
	// EventTookOver: a handover to this instance completed.
	EventTookOver = "took_over"
	// EventHandedOver: this instance handed the node over and the successor confirmed.
	EventHandedOver = "handed_over"
	// EventNotTaken: this instance released the node but the successor never confirmed (it
	// died or was too slow); whoever holds the lock next owns.
	EventNotTaken = "not_taken"
	// EventCalledOff: a handover stopped before the node changed hands (either side).
	EventCalledOff = "called_off"
	// EventOwnerGone: the owner exited or died and this instance took the node (no handover).
	EventOwnerGone = "owner_gone"
)

// Kinds of held calls (label "call" of handover_held_calls_total).
const (
	CallKubelet         = "kubelet"          // NodePrepareResources / NodeUnprepareResources
	CallCreateContainer = "create_container" // NRI CreateContainer of a vGPU container
)

// HandoverMetrics are the metrics of the node's ownership and its handovers (contract §8,
// §14). The pause is what issue 17 measures: the longest time a Prepare or a CreateContainer
// that arrived during an upgrade would have waited.
type HandoverMetrics struct {
	Owner     *metrics.Gauge
	Events    *metrics.CounterVec
	Pause     *metrics.Histogram
	HeldCalls *metrics.CounterVec
}

// NewHandoverMetrics creates the metrics and registers them on reg.
func NewHandoverMetrics(reg metrics.KubeRegistry) *HandoverMetrics {
	m := &HandoverMetrics{
		Owner: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: Namespace, Name: "handover_owner",
			Help:           "1 while this instance owns the node (holds the instance lock and serves), 0 while it observes.",
			StabilityLevel: metrics.ALPHA,
		}),
		Events: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "handover_events_total",
			Help:           "Changes of the node's ownership this instance took part in, by event.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"event"}),
		Pause: metrics.NewHistogram(&metrics.HistogramOpts{
			Namespace: Namespace, Name: "handover_pause_seconds",
			Help: "Per completed handover, how long the outgoing owner held new kubelet calls and vGPU CreateContainers " +
				"(from closing its gates until the incoming owner served): the longest any such call could have waited. " +
				"The outgoing instance measures it; the incoming one records the figure it is told.",
			Buckets:        metrics.ExponentialBuckets(0.001, 2, 14),
			StabilityLevel: metrics.ALPHA,
		}),
		HeldCalls: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "handover_held_calls_total",
			Help:           "Calls that arrived while a handover was being decided and waited for it, by call.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"call"}),
	}
	reg.MustRegister(m.Owner, m.Events, m.Pause, m.HeldCalls)
	return m
}
