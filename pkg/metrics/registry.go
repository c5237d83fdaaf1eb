package metrics

import (
	"time"

	"k8s.io/component-base/metrics"
)

// StatusNoResponse labels registry connections closed without an answer: the frame did not
// arrive within its deadline (contract §5).
const StatusNoResponse = "NO_RESPONSE"

// RegistryMetrics are the registry server's metrics (contract §8).
type RegistryMetrics struct {
	// Requests counts answered registrations by status name (OK, RETRY, NOT_FOUND, DENIED,
	// INVALID, BUSY, INTERNAL) and connections closed unanswered (NO_RESPONSE).
	Requests *metrics.CounterVec
	// Duration is the time from accept to the response written.
	Duration *metrics.Histogram
	// ShedConnections counts connections that had not sent their request, shed to make room
	// for a newcomer over the node-wide bound on open connections (contract §5); each is
	// also counted as BUSY in Requests.
	ShedConnections *metrics.Counter
}

// NewRegistryMetrics creates the registry metrics and registers them on reg.
func NewRegistryMetrics(reg metrics.KubeRegistry) *RegistryMetrics {
	m := &RegistryMetrics{
		Requests: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "registry_requests_total",
			Help:           "Registrations answered by the registry server, by status.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"status"}),
		// A registration costs ~100 µs to a few ms (reading a cgroup, writing pids.config);
		// buckets from 50 µs to ~3 s cover a stalled body (2 s) too.
		Duration: metrics.NewHistogram(&metrics.HistogramOpts{
			Namespace: Namespace, Name: "registry_request_duration_seconds",
			Help:           "Time from accepting a registry connection to writing its response.",
			Buckets:        metrics.ExponentialBuckets(0.00005, 2, 16),
			StabilityLevel: metrics.ALPHA,
		}),
		ShedConnections: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: Namespace, Name: "registry_shed_connections_total",
			Help:           "Registry connections that had not sent their request, answered BUSY to make room for a newcomer over the node's bound on open connections.",
			StabilityLevel: metrics.ALPHA,
		}),
	}
	reg.MustRegister(m.Requests, m.Duration, m.ShedConnections)
	return m
}

// Observe records one answered registration; a nil receiver records nothing.
func (m *RegistryMetrics) Observe(status string, d time.Duration) {
	if m == nil {
		return
	}
	m.Requests.WithLabelValues(status).Inc()
	m.Duration.Observe(d.Seconds())
}

// Unanswered records one connection closed without a response; a nil receiver records nothing.
func (m *RegistryMetrics) Unanswered() {
	if m == nil {
		return
	}
	m.Requests.WithLabelValues(StatusNoResponse).Inc()
}

// Shed records one connection shed for a newcomer; a nil receiver records nothing.
func (m *RegistryMetrics) Shed() {
	if m == nil {
		return
	}
	m.ShedConnections.Inc()
}
