// Package health serves the gRPC health protocol (grpc.health.v1) for the kubelet's liveness,
// startup and readiness probes. Each answer is computed from checks that other parts register
// (registered with the kubelet, DRA socket answers, NRI session healthy, registry socket answers;
// for the webhook, caches synced and a serving certificate loaded), so a probe never sees a stale
// cached status.
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

// Service names answered: "" (the whole server) and "liveness" run every liveness check;
// "readiness" runs those and then every readiness check.
const (
	ServiceLiveness  = "liveness"
	ServiceReadiness = "readiness"
)

// checkTimeout bounds one probe; the kubelet's own probe timeout is 1 s by default.
const checkTimeout = 900 * time.Millisecond

// Check reports nil when the part it covers is healthy.
type Check func(ctx context.Context) error

// Server answers grpc.health.v1 Check calls by running every registered check.
type Server struct {
	healthpb.UnimplementedHealthServer

	mu        sync.Mutex
	liveness  checkList
	readiness checkList
}

// checkList is a set of named checks in registration order.
type checkList struct {
	names  []string
	checks map[string]Check
}

func (l *checkList) add(name string, check Check) {
	if l.checks == nil {
		l.checks = map[string]Check{}
	}
	if _, ok := l.checks[name]; !ok {
		l.names = append(l.names, name)
	}
	l.checks[name] = check
}

// NewServer returns a server with no checks (it answers SERVING until checks are added).
func NewServer() *Server {
	return &Server{}
}

// Add registers a named liveness check; a later Add with the same name replaces it.
func (s *Server) Add(name string, check Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.liveness.add(name, check)
}

// AddReadiness registers a named check that only the "readiness" service runs: a part that is
// alive but cannot serve yet (caches not synced) must not be restarted, only kept out of its
// Service's endpoints.
func (s *Server) AddReadiness(name string, check Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readiness.add(name, check)
}

// Evaluate runs every liveness check in registration order and returns the first failure,
// naming it.
func (s *Server) Evaluate(ctx context.Context) error {
	return s.evaluate(ctx, false)
}

// EvaluateReadiness runs the liveness checks, then the readiness checks.
func (s *Server) EvaluateReadiness(ctx context.Context) error {
	return s.evaluate(ctx, true)
}

func (s *Server) evaluate(ctx context.Context, readiness bool) error {
	s.mu.Lock()
	var names []string
	var checks []Check
	lists := []*checkList{&s.liveness}
	if readiness {
		lists = append(lists, &s.readiness)
	}
	for _, l := range lists {
		for _, n := range l.names {
			names = append(names, n)
			checks = append(checks, l.checks[n])
		}
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
	var readiness bool
	switch req.GetService() {
	case "", ServiceLiveness:
	case ServiceReadiness:
		readiness = true
	default:
		return nil, status.Errorf(codes.NotFound, "unknown service %q", req.GetService())
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if err := s.evaluate(ctx, readiness); err != nil {
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
