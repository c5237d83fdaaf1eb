package component

import (
	"context"
	"crypto/tls"
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
// bound address. An empty address disables the endpoint (nil address, nil error). With access,
// the endpoint is HTTPS (a self-signed certificate made here) and answers only the readers
// access lets through; with nil access it is plain HTTP, open to anyone (--metrics-auth=none).
func ServeMetrics(ctx context.Context, address string, reg metrics.KubeRegistry, access *MetricsAccess) (net.Addr, error) {
	if address == "" {
		return nil, nil
	}
	logger := klog.FromContext(ctx).WithName("metrics")
	var handler http.Handler = MetricsHandler(reg)
	var tlsConfig *tls.Config
	if access != nil {
		cert, err := selfSignedCertificate(time.Now())
		if err != nil {
			return nil, err
		}
		handler = access.guard(logger, handler)
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	lis, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", address, err)
	}
	if tlsConfig != nil {
		lis = tls.NewListener(lis, tlsConfig)
	}
	mux := http.NewServeMux()
	mux.Handle(MetricsPath, handler)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "Metrics server stopped", "address", address)
		}
	}()
	logger.Info("Serving metrics", "address", lis.Addr().String(), "https", tlsConfig != nil, "auth", access != nil)
	return lis.Addr(), nil
}
