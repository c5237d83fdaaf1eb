package integration

import (
	"context"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDRAServerFailureStopsThePlugin: when the helper's DRA gRPC server fails (here its socket
// listener dies under it) nothing in the process can bring it back; the plugin reports the
// failure (Failed, Err), counts it, and the command exits so that the DaemonSet restarts it.
func TestDRAServerFailureStopsThePlugin(t *testing.T) {
	n := newNode(t)
	var mu sync.Mutex
	var lis net.Listener
	n.draListen = func(ctx context.Context, path string) (net.Listener, error) {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		l, err := (&net.ListenConfig{}).Listen(ctx, "unix", path)
		mu.Lock()
		lis = l
		mu.Unlock()
		return l, err
	}
	n.start()
	n.register()
	select {
	case <-n.plugin.Failed():
		t.Fatalf("failed before anything broke: %v", n.plugin.Err())
	default:
	}

	mu.Lock()
	_ = lis.Close()
	mu.Unlock()
	select {
	case <-n.plugin.Failed():
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not report the dead DRA server")
	}
	if err := n.plugin.Err(); err == nil || !strings.Contains(err.Error(), "DRA gRPC server failed") {
		t.Errorf("Err() = %v, want it to name the DRA gRPC server", err)
	}
	if got := counterValue(t, n, "vgpu_dra_helper_errors_total", "severity", "fatal"); got != 1 {
		t.Errorf("helper_errors_total{severity=fatal} = %v, want 1", got)
	}
}
