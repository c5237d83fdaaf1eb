package integration

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
)

// TestClaimPathDuringHealthySession: once the first NRI session is up, choosing a new claim's
// path is immediate. (It used to wait for the first session to END, so every Prepare on a
// healthy node sat out the first-attempt timer: 2 s per claim.) The timer is set to an hour
// here, so the answer can only come from the session itself.
func TestClaimPathDuringHealthySession(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "nri.sock")
	startNRIRuntime(t, sock)
	m := metrics.NewNRIMetrics(k8smetrics.NewKubeRegistry())
	p := nri.NewPlugin(nri.Config{Layout: claimdir.Layout{StateDir: filepath.Join(dir, "state")}}, staticClaims{}, m, klog.Background())
	s := nri.NewSupervisor(nri.SupervisorConfig{PluginName: driverName, PluginIndex: "00", Socket: sock, FirstAttemptWait: time.Hour}, p, m, klog.Background())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go s.Run(ctx)

	got := make(chan contract.ClaimPath, 1)
	go func() { got <- s.ClaimPath(context.Background()) }()
	select {
	case path := <-got:
		if path != contract.PathNRI {
			t.Errorf("path during a healthy session = %q, want %q", path, contract.PathNRI)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ClaimPath still waiting 30 s into a healthy NRI session: it waits for the first session to end, not for its outcome")
	}
}
