package metrics

import "k8s.io/component-base/metrics"

// Labels of the webhook's metrics (contract §8).
const (
	// WebhookMutating and WebhookValidating are the values of label "webhook".
	WebhookMutating   = "mutating"
	WebhookValidating = "validating"

	// DecisionAllowed: admitted unchanged. DecisionPatched: admitted with the required-plugins
	// annotation. DecisionDenied: refused by a rule. DecisionError: the review itself failed
	// (malformed request, a lookup that failed); the API server then refuses the object
	// (failurePolicy Fail).
	DecisionAllowed = "allowed"
	DecisionPatched = "patched"
	DecisionDenied  = "denied"
	DecisionError   = "error"
)

// WebhookMetrics are vgpu-webhook's metrics (contract §8). Denial reasons are the webhook's
// Reason* constants.
type WebhookMetrics struct {
	// Admissions counts reviews by webhook, kind of object and decision.
	Admissions *metrics.CounterVec
	// Denials counts the rules that refusals named, by reason (one refusal can name several).
	Denials *metrics.CounterVec
	// Duration is the time from the request read to the response written, by webhook and kind.
	Duration *metrics.HistogramVec
}

// NewWebhookMetrics creates the webhook's metrics and registers them on reg.
func NewWebhookMetrics(reg metrics.KubeRegistry) *WebhookMetrics {
	m := &WebhookMetrics{
		Admissions: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "webhook_admissions_total",
			Help:           "Admission reviews answered, by webhook (mutating, validating), kind and decision (allowed, patched, denied, error).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"webhook", "kind", "decision"}),
		Denials: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: Namespace, Name: "webhook_denials_total",
			Help:           "Rules named by refused admissions, by reason.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"reason"}),
		// A review is a few cache lookups (tens of µs); one that waits for a claim the cache
		// has not seen yet takes up to the wait bound (2 s): buckets from 25 µs to ~3.3 s.
		Duration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Namespace: Namespace, Name: "webhook_admission_duration_seconds",
			Help:    "Time to answer one admission review, by webhook and kind.",
			Buckets: metrics.ExponentialBuckets(0.000025, 2, 18), StabilityLevel: metrics.ALPHA,
		}, []string{"webhook", "kind"}),
	}
	reg.MustRegister(m.Admissions, m.Denials, m.Duration)
	return m
}
