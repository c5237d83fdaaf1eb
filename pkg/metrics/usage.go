package metrics

import (
	"time"

	"k8s.io/component-base/metrics"
)

// UsageMetrics are the per-container usage sampler's own metrics (contract §8). The
// per-container and per-GPU series themselves come from pkg/usage's collector.
type UsageMetrics struct {
	// ReadErrors counts reads that failed, by source: config, pids, ledger, nvml.
	ReadErrors *metrics.CounterVec
	// SampleDuration is the time one sample of the whole node takes.
	SampleDuration *metrics.Histogram
}

// NewUsageMetrics creates the sampler's metrics and registers them on reg.
func NewUsageMetrics(reg metrics.KubeRegistry) *UsageMetrics {
	m := &UsageMetrics{
		ReadErrors: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "usage_read_errors_total",
			Help:           "Reads of a container's vgpu.config, pids.config, ledger, or of NVML's per-process figures, that failed while sampling usage, by source.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"source"}),
		// ~10 µs per container here (docs/performance.md): 100 µs to ~3 s.
		SampleDuration: metrics.NewHistogram(&metrics.HistogramOpts{
			Namespace: Namespace, Name: "usage_sample_duration_seconds",
			Help:           "Time to sample every vGPU container's usage once (files and NVML), off any request's path.",
			Buckets:        metrics.ExponentialBuckets(0.0001, 2, 15),
			StabilityLevel: metrics.ALPHA,
		}),
	}
	reg.MustRegister(m.ReadErrors, m.SampleDuration)
	return m
}

// ReadError counts one failed read; a nil receiver counts nothing.
func (m *UsageMetrics) ReadError(source string) {
	if m != nil {
		m.ReadErrors.WithLabelValues(source).Inc()
	}
}

// Observe records one sample's duration; a nil receiver records nothing.
func (m *UsageMetrics) Observe(d time.Duration) {
	if m != nil {
		m.SampleDuration.Observe(d.Seconds())
	}
}

// RegisterNRILost registers the two gauges that say whether NRI has been lost for longer than
// the grace (the alert's question, contract §8): nri_lost_seconds (lostFor, read at scrape
// time) and nri_failure_grace_seconds. The plugin calls it once the supervisor exists.
func RegisterNRILost(reg metrics.KubeRegistry, lostFor func() time.Duration, grace time.Duration) {
	reg.CustomMustRegister(&nriLostCollector{
		lostFor: lostFor, grace: grace,
		lost: metrics.NewDesc(Namespace+"_nri_lost_seconds",
			"Seconds since this process's last good NRI session ended, while it has none; 0 while connected and on a node whose runtime never offered NRI.",
			nil, nil, metrics.ALPHA, ""),
		graceDesc: metrics.NewDesc(Namespace+"_nri_failure_grace_seconds",
			"How long NRI may be lost after a good session before liveness fails (--nri-failure-grace).",
			nil, nil, metrics.ALPHA, ""),
	})
}

type nriLostCollector struct {
	metrics.BaseStableCollector
	lostFor         func() time.Duration
	grace           time.Duration
	lost, graceDesc *metrics.Desc
}

func (c *nriLostCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- c.lost
	ch <- c.graceDesc
}

func (c *nriLostCollector) CollectWithStability(ch chan<- metrics.Metric) {
	ch <- metrics.NewLazyConstMetric(c.lost, metrics.GaugeValue, c.lostFor().Seconds())
	ch <- metrics.NewLazyConstMetric(c.graceDesc, metrics.GaugeValue, c.grace.Seconds())
}
