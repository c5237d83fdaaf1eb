package metrics

import "k8s.io/component-base/metrics"

// Hooks of the embedded NRI plugin (label "hook" of nri_hook_duration_seconds).
const (
	HookSynchronize     = "synchronize"
	HookCreateContainer = "create_container"
	HookStartContainer  = "start_container"
	HookStopContainer   = "stop_container"
	HookRemoveContainer = "remove_container"
	HookStopPodSandbox  = "stop_pod_sandbox"
)

// NRIMetrics are the embedded NRI plugin's metrics (contract §8). Rejection reasons are the
// contract.Reject* constants.
type NRIMetrics struct {
	HookDuration *metrics.HistogramVec
	Injections   *metrics.Counter
	Rejections   *metrics.CounterVec
	// Failures counts containers the plugin failed (collisions, invariant, errors), by hook, and
	// cleanup errors, which are logged and counted but never fail the CRI call.
	Failures *metrics.CounterVec
	// Stops counts vGPU containers the plugin stopped because the runtime had created them
	// without its adjustment (contract §4, "When the plugin does not answer").
	Stops        *metrics.Counter
	Connected    *metrics.Gauge
	Reconnects   *metrics.Counter
	CacheEntries *metrics.Gauge
}

// NewNRIMetrics creates the NRI metrics and registers them on reg.
func NewNRIMetrics(reg metrics.KubeRegistry) *NRIMetrics {
	m := &NRIMetrics{
		// Every NRI call on a node is serialized by the runtime: buckets from 10 µs to ~0.3 s.
		HookDuration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Namespace: Namespace, Name: "nri_hook_duration_seconds",
			Help:    "Time the embedded NRI plugin spends in one hook, by hook.",
			Buckets: metrics.ExponentialBuckets(0.00001, 2, 16), StabilityLevel: metrics.ALPHA,
		}, []string{"hook"}),
		Injections: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: Namespace, Name: "nri_injections_total",
			Help:           "vGPU containers given their per-container directories and identity.",
			StabilityLevel: metrics.ALPHA,
		}),
		Rejections: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "nri_rejections_total",
			Help:           "Containers that carried a vGPU claim UID but were created without an adjustment, by reason.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"reason"}),
		Failures: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "nri_errors_total",
			Help:           "Errors in NRI hooks, by hook: failed containers in create_container, cleanup errors elsewhere.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"hook"}),
		Stops: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: Namespace, Name: "nri_stops_total",
			Help:           "vGPU containers stopped because the runtime had created them without the plugin's adjustment (the plugin did not answer their CreateContainer).",
			StabilityLevel: metrics.ALPHA,
		}),
		Connected: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: Namespace, Name: "nri_connected",
			Help:           "1 while the NRI plugin is registered with the runtime and synchronized, else 0.",
			StabilityLevel: metrics.ALPHA,
		}),
		Reconnects: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: Namespace, Name: "nri_reconnects_total",
			Help:           "NRI sessions started after the first one (the runtime restarted or dropped the plugin).",
			StabilityLevel: metrics.ALPHA,
		}),
		CacheEntries: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: Namespace, Name: "nri_cache_entries",
			Help:           "vGPU container instances in the NRI cache.",
			StabilityLevel: metrics.ALPHA,
		}),
	}
	reg.MustRegister(m.HookDuration, m.Injections, m.Rejections, m.Failures, m.Stops, m.Connected, m.Reconnects, m.CacheEntries)
	return m
}
