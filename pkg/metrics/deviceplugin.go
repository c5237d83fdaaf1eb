package metrics

import (
	"time"

	"k8s.io/component-base/metrics"
)

// Reasons of deviceplugin_allocate_errors_total (contract §8, §12).
const (
	ReasonInvalidDevice = "invalid_device" // no IDs, an unknown or a repeated ID
	// ReasonUnhealthyDevice ("unhealthy_device") and ReasonFilesystem ("filesystem") are shared
	// with prepare_errors_total.
)

// DevicePluginMetrics are the device plugin's own metrics (contract §8).
type DevicePluginMetrics struct {
	AllocateDuration  *metrics.Histogram
	AllocateErrors    *metrics.CounterVec
	PreferredDuration *metrics.Histogram
	// Registrations counts registrations the kubelet accepted.
	Registrations *metrics.Counter
	// Shares is the number of shares by health ("healthy", "unhealthy").
	Shares *metrics.GaugeVec
}

// NewDevicePluginMetrics creates the device plugin's metrics and registers them on reg.
func NewDevicePluginMetrics(reg metrics.KubeRegistry) *DevicePluginMetrics {
	m := &DevicePluginMetrics{
		// Allocate mounts a tmpfs and writes a few files: ~0.1 ms to a few ms.
		AllocateDuration: metrics.NewHistogram(&metrics.HistogramOpts{
			Namespace: Namespace, Name: "deviceplugin_allocate_duration_seconds",
			Help:           "Time to answer one container's Allocate request.",
			Buckets:        metrics.ExponentialBuckets(0.00005, 2, 16),
			StabilityLevel: metrics.ALPHA,
		}),
		AllocateErrors: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "deviceplugin_allocate_errors_total",
			Help:           "Container Allocate requests refused or failed, by reason.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"reason"}),
		// A preference is computed in memory: ~1 µs to a few hundred µs.
		PreferredDuration: metrics.NewHistogram(&metrics.HistogramOpts{
			Namespace: Namespace, Name: "deviceplugin_preferred_allocation_duration_seconds",
			Help:           "Time to answer one container's GetPreferredAllocation request.",
			Buckets:        metrics.ExponentialBuckets(0.000001, 2, 16),
			StabilityLevel: metrics.ALPHA,
		}),
		Registrations: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: Namespace, Name: "deviceplugin_registrations_total",
			Help:           "Registrations with the kubelet that it accepted (one per kubelet start or plugin socket).",
			StabilityLevel: metrics.ALPHA,
		}),
		Shares: metrics.NewGaugeVec(&metrics.GaugeOpts{
			Namespace: Namespace, Name: "deviceplugin_shares",
			Help:           "Shares offered to the kubelet, by health.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"health"}),
	}
	reg.MustRegister(m.AllocateDuration, m.AllocateErrors, m.PreferredDuration, m.Registrations, m.Shares)
	return m
}

// ObserveAllocate records one container's Allocate; reason is "" when it succeeded.
func (m *DevicePluginMetrics) ObserveAllocate(d time.Duration, reason string) {
	m.AllocateDuration.Observe(d.Seconds())
	if reason != "" {
		m.AllocateErrors.WithLabelValues(reason).Inc()
	}
}
