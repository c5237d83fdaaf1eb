package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
)

func probe(t *testing.T, n *node) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	c := dialTCP(t, n.plugin.HealthAddr().String())
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{Service: "liveness"})
	if err != nil {
		t.Fatalf("health Check: %v", err)
	}
	return resp.Status
}

// TestLivenessFollowsKubeletRegistration: NOT_SERVING until the kubelet confirms the
// registration, SERVING then, NOT_SERVING again when the registration socket is removed
// (the kubelet dropped the plugin; a liveness restart re-creates the socket).
func TestLivenessFollowsKubeletRegistration(t *testing.T) {
	n := newNode(t, func(c *plugin.Config) { c.HealthAddress = "127.0.0.1:0" })
	n.start()
	if got := probe(t, n); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("before registration: %v, want NOT_SERVING", got)
	}
	n.register()
	if got := probe(t, n); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("after registration: %v, want SERVING", got)
	}
	if err := os.Remove(filepath.Join(n.cfg.KubeletDir, "plugins_registry", driverName+"-reg.sock")); err != nil {
		t.Fatal(err)
	}
	if got := probe(t, n); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("registration socket removed: %v, want NOT_SERVING", got)
	}
	n.restart()
	n.register()
	if got := probe(t, n); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("after restart: %v, want SERVING", got)
	}
}

// TestConcurrentPrepareUnprepare: many kubelet calls at once, for distinct claims and for the
// same claims, end with exactly the claims that should be prepared, each with its files.
func TestConcurrentPrepareUnprepare(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	const claims = 40
	all := make([]*resourceapi.ResourceClaim, claims)
	for i := range all {
		all[i] = n.newClaim(fmt.Sprintf("c%d", i), allocated{request: "gpu", device: fmt.Sprintf("gpu-%d", i%2), memory: "1Gi", cores: 2,
			shareID: fmt.Sprintf("5a4e%04d-0000-4000-8000-000000000000", i)})
	}
	var wg sync.WaitGroup
	for i := range all {
		for range 2 { // the same claim twice at once, as a kubelet retry racing the original
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r := k.prepare(t, all[i])[string(all[i].UID)]; r.Error != "" {
					t.Errorf("prepare %s: %s", all[i].Name, r.Error)
				}
			}()
		}
	}
	wg.Wait()
	for i := 0; i < claims; i += 2 {
		wg.Add(1)
		go func() { defer wg.Done(); k.unprepare(t, all[i]) }()
	}
	wg.Wait()
	cp := n.readCheckpoint()
	if len(cp.Claims) != claims/2 {
		t.Errorf("checkpoint holds %d claims, want %d", len(cp.Claims), claims/2)
	}
	for i, c := range all {
		prepared := i%2 == 1
		if got := exists(n.specPath(string(c.UID))) && exists(n.claimDir(string(c.UID))); got != prepared {
			t.Errorf("claim %s: files present = %v, want %v", c.Name, got, prepared)
		}
		if _, ok := cp.Claims[string(c.UID)]; ok != prepared {
			t.Errorf("claim %s: in checkpoint = %v, want %v", c.Name, ok, prepared)
		}
	}
	if got := gaugeValue(t, n, "vgpu_dra_prepared_claims"); got != claims/2 {
		t.Errorf("prepared_claims = %v, want %d", got, claims/2)
	}
}
