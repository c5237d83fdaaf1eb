// Package health serves the gRPC health protocol (grpc.health.v1) for the kubelet's liveness and
// startup probes. Each answer is computed from checks that other parts register (registered with
// the kubelet, DRA socket answers, NRI session healthy, registry socket answers), so a probe never
// sees a stale cached status.
package health

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// Service names answered: "" (the whole server) and "liveness"; both run every check.
var services = map[string]bool{"": true, "liveness": true}

// checkTimeout bounds one probe; the kubelet's own probe timeout is 1 s by default.
const checkTimeout = 900 * time.Millisecond

// Check reports nil when the part it covers is healthy.
type Check func(ctx context.Context) error

// Server answers grpc.health.v1 Check calls by running every registered check.
type Server struct {
	healthpb.UnimplementedHealthServer

	mu     sync.Mutex
	names  []string
	checks map[string]Check
}

// NewServer returns a server with no checks (it answers SERVING until checks are added).
func NewServer() *Server {
	return &Server{checks: map[string]Check{}}
}

// Add registers a named check; a later Add with the same name replaces it.
func (s *Server) Add(name string, check Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.checks[name]; !ok {
		s.names = append(s.names, name)
	}
	s.checks[name] = check
}

// Evaluate runs every check in registration order and returns the first failure, naming it.
func (s *Server) Evaluate(ctx context.Context) error {
	s.mu.Lock()
	names := append([]string(nil), s.names...)
	checks := make([]Check, len(names))
	for i, n := range names {
		checks[i] = s.checks[n]
	}
	s.mu.Unlock()
	for i, check := range checks {
		if err := check(ctx); err != nil {
			return fmt.Errorf("%s: %w", names[i], err)
		}
	}
	return nil
}

// Check implements grpc.health.v1.Health/Check.
func (s *Server) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if !services[req.GetService()] {
		return nil, status.Errorf(codes.NotFound, "unknown service %q", req.GetService())
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if err := s.Evaluate(ctx); err != nil {
		klog.FromContext(ctx).V(2).Info("Health check failed", "service", req.GetService(), "err", err)
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// Serve listens on address (e.g. ":51515") and serves the health service until ctx ends.
// It returns the bound address (useful with port 0); an empty address disables it (nil, nil).
func (s *Server) Serve(ctx context.Context, address string) (net.Addr, error) {
	if address == "" {
		return nil, nil
	}
	lis, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("listen for health on %s: %w", address, err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, s)
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	go func() {
		if err := srv.Serve(lis); err != nil {
			klog.FromContext(ctx).Error(err, "Health server stopped")
		}
	}()
	return lis.Addr(), nil
}
