// Package metrics defines the Prometheus metrics of vgpu-dra's binaries (contract §8): the
// kubelet plugin's (this file, nri.go, registry.go) and the webhook's (webhook.go), each on a
// registry of the instance's own (pkg/component serves it), so that several instances in one
// test process do not collide.
package metrics

import (
	"k8s.io/component-base/metrics"
)

// Namespace prefixes every metric name (contract §8).
const Namespace = "vgpu_dra"

// Reasons for prepare errors (label "reason" of prepare_errors_total).
const (
	ReasonInvalidClaim     = "invalid_claim"     // a result the plugin cannot serve: foreign pool, unknown device, bad capacity
	ReasonUnhealthyDevice  = "unhealthy_device"  // the allocated GPU is unhealthy
	ReasonOvercommitted    = "overcommitted"     // the GPU's capacity would be exceeded (last line of defence)
	ReasonMIG              = "mig"               // a MIG instance or mode could not be made as the claim needs
	ReasonCheckpoint       = "checkpoint"        // the checkpoint could not be written
	ReasonFilesystem       = "filesystem"        // claim directory or CDI spec could not be written
	ReasonUnprepareFailure = "unprepare_failure" // used by unprepare_errors_total
)

// Metrics holds every metric of one plugin instance.
type Metrics struct {
	Registry metrics.KubeRegistry

	PrepareDuration   *metrics.Histogram
	UnprepareDuration *metrics.Histogram
	PrepareErrors     *metrics.CounterVec
	UnprepareErrors   *metrics.CounterVec
	PreparedClaims    *metrics.Gauge
	PublishedDevices  *metrics.Gauge
	// QuarantinedClaims are prepared claims that start-up recovery could not restore.
	QuarantinedClaims *metrics.Gauge
}

// New creates the metrics on reg (component.NewMetricsRegistry: one registry per instance).
func New(reg metrics.KubeRegistry) *Metrics {
	// Prepare is mostly disk I/O (an fsync'd checkpoint write costs ~1 ms here): buckets from
	// 0.5 ms to ~16 s.
	buckets := metrics.ExponentialBuckets(0.0005, 2, 16)
	m := &Metrics{
		Registry: reg,
		PrepareDuration: metrics.NewHistogram(&metrics.HistogramOpts{
			Namespace: Namespace, Name: "prepare_duration_seconds",
			Help:    "Time to prepare one ResourceClaim (NodePrepareResources, per claim).",
			Buckets: buckets, StabilityLevel: metrics.ALPHA,
		}),
		UnprepareDuration: metrics.NewHistogram(&metrics.HistogramOpts{
			Namespace: Namespace, Name: "unprepare_duration_seconds",
			Help:    "Time to unprepare one ResourceClaim (NodeUnprepareResources, per claim).",
			Buckets: buckets, StabilityLevel: metrics.ALPHA,
		}),
		PrepareErrors: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "prepare_errors_total",
			Help:           "ResourceClaims whose preparation failed, by reason.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"reason"}),
		UnprepareErrors: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "unprepare_errors_total",
			Help:           "ResourceClaims whose unpreparation failed, by reason.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"reason"}),
		PreparedClaims: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: Namespace, Name: "prepared_claims",
			Help:           "ResourceClaims currently prepared on this node.",
			StabilityLevel: metrics.ALPHA,
		}),
		PublishedDevices: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: Namespace, Name: "published_devices",
			Help:           "Devices published in this node's ResourceSlices.",
			StabilityLevel: metrics.ALPHA,
		}),
		QuarantinedClaims: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: Namespace, Name: "quarantined_claims",
			Help:           "Prepared ResourceClaims whose files start-up recovery could not restore; their Prepare and containers fail with the reason until a Prepare restores them.",
			StabilityLevel: metrics.ALPHA,
		}),
	}
	m.Registry.MustRegister(m.PrepareDuration, m.UnprepareDuration, m.PrepareErrors,
		m.UnprepareErrors, m.PreparedClaims, m.PublishedDevices, m.QuarantinedClaims)
	return m
}
