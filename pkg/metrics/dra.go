package metrics

import "k8s.io/component-base/metrics"

// Severities of errors the DRA helper reports (label "severity" of helper_errors_total).
const (
	// SeverityRecoverable: the helper retries (ResourceSlice publishing, stale health reports).
	SeverityRecoverable = "recoverable"
	// SeverityFatal: the helper cannot go on (its gRPC servers failed); the plugin exits.
	SeverityFatal = "fatal"
)

// Reasons a claim prepared here is unprepared by the reconciliation with the API server (label
// "reason" of reconciled_claims_total).
const (
	// ReconcileDeleted: the claim no longer exists (or a new one has its name).
	ReconcileDeleted = "deleted"
	// ReconcileDeallocated: the claim is no longer allocated to this node's devices.
	ReconcileDeallocated = "deallocated"
	// ReconcileNotReserved: the claim is reserved for no pod any more.
	ReconcileNotReserved = "not_reserved"
)

// Outcomes of writing a claim's device status (label "outcome" of claim_status_writes_total).
const (
	StatusWritten = "written"
	// StatusRetried: a write failed and is retried with backoff.
	StatusRetried = "retried"
	// StatusDropped: a write the API server refused for good (claim gone, not allowed, invalid).
	StatusDropped = "dropped"
)

// DRAMetrics are the metrics of the DRA features around Prepare (contract §8): the helper's
// background errors, the reconciliation with the API server, the claims' device status and
// ResourceSlice publishing.
type DRAMetrics struct {
	HelperErrors     *metrics.CounterVec
	ReconciledClaims *metrics.CounterVec
	ReconcileErrors  *metrics.Counter
	// StaleClaimsInUse counts the stale claims kept for their running containers, once per
	// claim and reason; StaleClaimsHeld is how many are kept now; StaleClaimStops counts the
	// containers stopped for such claims (--stale-claim-containers=stop).
	StaleClaimsInUse   *metrics.CounterVec
	StaleClaimsHeld    *metrics.Gauge
	StaleClaimStops    *metrics.Counter
	ClaimStatusWrites  *metrics.CounterVec
	SlicePublishErrors *metrics.Counter
	// GPUHealthTransitions counts the GPUs' changes between healthy and unhealthy, by the
	// state changed to (HealthTransitionUnhealthy, HealthTransitionHealthy).
	GPUHealthTransitions *metrics.CounterVec
}

// States a GPU's health changed to (label "to" of gpu_health_transitions_total).
const (
	HealthTransitionUnhealthy = "unhealthy"
	HealthTransitionHealthy   = "healthy"
)

// NewDRAMetrics creates the metrics and registers them on reg.
func NewDRAMetrics(reg metrics.KubeRegistry) *DRAMetrics {
	m := &DRAMetrics{
		HelperErrors: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "helper_errors_total",
			Help:           "Errors the DRA kubelet-plugin helper reported (HandleError), by severity; a fatal one makes the plugin exit.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"severity"}),
		ReconciledClaims: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "reconciled_claims_total",
			Help:           "Claims prepared on this node that the reconciliation with the API server unprepared, by reason.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"reason"}),
		ReconcileErrors: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: Namespace, Name: "reconcile_errors_total",
			Help:           "Claims the reconciliation could not check (API errors) or could not unprepare.",
			StabilityLevel: metrics.ALPHA,
		}),
		StaleClaimsInUse: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "stale_claims_in_use_total",
			Help:           "Claims the API server no longer has in use on this node (reason: deleted, deallocated, not_reserved) that the reconciliation kept prepared because containers still ran with them; once per claim and reason.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"reason"}),
		StaleClaimsHeld: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: Namespace, Name: "stale_claims_in_use",
			Help:           "Claims kept prepared, their capacity held, for containers that still run with them although the API server no longer has them in use on this node.",
			StabilityLevel: metrics.ALPHA,
		}),
		StaleClaimStops: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: Namespace, Name: "stale_claim_containers_stopped_total",
			Help:           "Containers stopped because they ran with a claim the API server no longer had in use on this node (--stale-claim-containers=stop).",
			StabilityLevel: metrics.ALPHA,
		}),
		ClaimStatusWrites: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "claim_status_writes_total",
			Help:           "Writes of ResourceClaim status.devices, by outcome (written, retried, dropped).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"outcome"}),
		SlicePublishErrors: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: Namespace, Name: "slice_publish_errors_total",
			Help:           "Failed attempts to hand the ResourceSlice to the helper; each is retried with backoff.",
			StabilityLevel: metrics.ALPHA,
		}),
		GPUHealthTransitions: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "gpu_health_transitions_total",
			Help:           "Changes of a GPU's health between healthy and unhealthy that this plugin saw, by the state changed to (to: unhealthy, healthy).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"gpu_uuid", "device", "to"}),
	}
	reg.MustRegister(m.HelperErrors, m.ReconciledClaims, m.ReconcileErrors, m.StaleClaimsInUse, m.StaleClaimsHeld, m.StaleClaimStops, m.ClaimStatusWrites, m.SlicePublishErrors, m.GPUHealthTransitions)
	return m
}
