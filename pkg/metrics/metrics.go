// Package metrics defines the plugin's Prometheus metrics (contract §8) on a registry of its own,
// so that several plugin instances in one test process do not collide, and serves them over HTTP.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"
)

// Namespace prefixes every metric name (contract §8).
const Namespace = "vgpu_dra"

// Reasons for prepare errors (label "reason" of prepare_errors_total).
const (
	ReasonInvalidClaim     = "invalid_claim"     // a result the plugin cannot serve: foreign pool, unknown device, bad capacity
	ReasonUnhealthyDevice  = "unhealthy_device"  // the allocated GPU is unhealthy
	ReasonOvercommitted    = "overcommitted"     // the GPU's capacity would be exceeded (last line of defence)
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
}

// New creates the metrics on a fresh registry.
func New() *Metrics {
	// Prepare is mostly disk I/O (an fsync'd checkpoint write costs ~1 ms here): buckets from
	// 0.5 ms to ~16 s.
	buckets := metrics.ExponentialBuckets(0.0005, 2, 16)
	m := &Metrics{
		Registry: metrics.NewKubeRegistry(),
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
	}
	m.Registry.MustRegister(m.PrepareDuration, m.UnprepareDuration, m.PrepareErrors,
		m.UnprepareErrors, m.PreparedClaims, m.PublishedDevices)
	return m
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return metrics.HandlerFor(m.Registry, metrics.HandlerOpts{ErrorHandling: metrics.ContinueOnError})
}

// Serve serves /metrics on address until ctx ends. An empty address disables the endpoint.
func (m *Metrics) Serve(ctx context.Context, address string) error {
	if address == "" {
		return nil
	}
	lis, err := net.Listen("tcp", address)
	if err != nil {
		return fmt.Errorf("listen for metrics on %s: %w", address, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics server stopped", "address", address)
		}
	}()
	klog.FromContext(ctx).Info("Serving metrics", "address", lis.Addr().String())
	return nil
}
