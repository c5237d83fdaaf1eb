package component

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/restclient" // client-go's rest_client_* metrics, process-wide
	"k8s.io/klog/v2"
)

// NewMetricsRegistry returns a registry for one instance's own metrics. Each instance gets its
// own, so that several plugin instances in one test process do not collide; what is one per
// process (the Go runtime, the process, client-go's REST client) lives in component-base's
// legacy registry and is served next to it by MetricsHandler.
func NewMetricsRegistry() metrics.KubeRegistry { return metrics.NewKubeRegistry() }

// MetricsHandler serves reg together with the process-wide metrics in the Prometheus text format.
func MetricsHandler(reg metrics.KubeRegistry) http.Handler {
	return metrics.HandlerFor(prometheus.Gatherers{reg, legacyregistry.DefaultGatherer},
		metrics.HandlerOpts{ErrorHandling: metrics.ContinueOnError})
}

// ServeMetrics serves /metrics (MetricsHandler of reg) on address until ctx ends and returns the
// bound address. An empty address disables the endpoint (nil address, nil error).
func ServeMetrics(ctx context.Context, address string, reg metrics.KubeRegistry) (net.Addr, error) {
	if address == "" {
		return nil, nil
	}
	lis, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", address, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", MetricsHandler(reg))
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
	return lis.Addr(), nil
}
