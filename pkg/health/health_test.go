package health

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestHealthOverGRPC(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := NewServer()
	var registered, draUp atomic.Bool
	s.Add("registered", func(context.Context) error {
		if !registered.Load() {
			return errors.New("not registered with the kubelet")
		}
		return nil
	})
	s.Add("dra-socket", func(context.Context) error {
		if !draUp.Load() {
			return errors.New("DRA socket does not answer")
		}
		return nil
	})
	addr, err := s.Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("Check(%q): %v", service, err)
		}
		return resp.Status
	}
	for _, svc := range []string{"", "liveness"} {
		if got := check(svc); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("%q before registration = %v, want NOT_SERVING", svc, got)
		}
	}
	registered.Store(true)
	if got := check("liveness"); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("liveness with DRA socket down = %v, want NOT_SERVING", got)
	}
	draUp.Store(true)
	for _, svc := range []string{"", "liveness"} {
		if got := check(svc); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%q when healthy = %v, want SERVING", svc, got)
		}
	}
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{Service: "other"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("unknown service: err = %v, want NotFound", err)
	}

	// Readiness runs the liveness checks and its own; liveness never runs a readiness check.
	if got := check("readiness"); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("readiness with no readiness checks = %v, want SERVING", got)
	}
	var synced atomic.Bool
	s.AddReadiness("caches", func(context.Context) error {
		if !synced.Load() {
			return errors.New("caches not synced")
		}
		return nil
	})
	if got := check("readiness"); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("readiness before sync = %v, want NOT_SERVING", got)
	}
	if got := check("liveness"); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("liveness with a readiness check failing = %v, want SERVING", got)
	}
	if err := s.EvaluateReadiness(ctx); err == nil || err.Error() != "caches: caches not synced" {
		t.Errorf("EvaluateReadiness = %v, want the failing check named", err)
	}
	synced.Store(true)
	draUp.Store(false)
	if got := check("readiness"); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("readiness with a liveness check failing = %v, want NOT_SERVING", got)
	}
	draUp.Store(true)
	if got := check("readiness"); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("readiness when synced and healthy = %v, want SERVING", got)
	}
}
