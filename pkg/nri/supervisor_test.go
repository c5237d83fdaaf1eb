package nri

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/net/multiplex"
	"github.com/containerd/ttrpc"
	"k8s.io/klog/v2"
)

// silentRuntime accepts an NRI plugin's registration and then never configures it, like a
// runtime that dies between the two: the plugin's Start waits for a Configure that never comes.
type silentRuntime struct{ registrations atomic.Int32 }

func (r *silentRuntime) RegisterPlugin(context.Context, *api.RegisterPluginRequest) (*api.Empty, error) {
	r.registrations.Add(1)
	return &api.Empty{}, nil
}

func (r *silentRuntime) UpdateContainers(context.Context, *api.UpdateContainersRequest) (*api.UpdateContainersResponse, error) {
	return &api.UpdateContainersResponse{}, nil
}

func serveSilentRuntime(t *testing.T, socket string) *silentRuntime {
	t.Helper()
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	rt := &silentRuntime{}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mux := multiplex.Multiplex(conn)
			rl, err := mux.Listen(multiplex.RuntimeServiceConn)
			if err != nil {
				_ = conn.Close()
				continue
			}
			srv, err := ttrpc.NewServer()
			if err != nil {
				_ = conn.Close()
				continue
			}
			api.RegisterRuntimeService(srv, rt)
			go func() { _ = srv.Serve(context.Background(), rl) }()
			t.Cleanup(func() { _ = srv.Close(); _ = mux.Close() })
		}
	}()
	t.Cleanup(func() { _ = l.Close() })
	return rt
}

// TestWatchdogLeavesNothingBlocked: every watchdog expiry against a runtime that never
// configures the plugin releases its stub; after many attempts and a Drain, the goroutines are
// back to where they were (before the fix each expiry left the stub's Start and its
// connection-closed handler blocked for ever).
func TestWatchdogLeavesNothingBlocked(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "vgw-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	socket := filepath.Join(dir, "nri.sock")
	rt := serveSilentRuntime(t, socket)

	f := newFixture(t)
	s := NewSupervisor(SupervisorConfig{PluginName: "vgpu.dra.dev", Socket: socket, StartTimeout: 50 * time.Millisecond},
		f.plugin, f.metrics, klog.Background())
	go s.Run(context.Background())
	waitFor(t, func() bool { return rt.registrations.Load() >= 5 })
	if err := s.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := s.Status(); st.Sessions != 0 || st.Attempts < 5 || st.LastError == "" {
		t.Errorf("status %+v: want attempts that timed out and no session", st)
	}
	// The fake runtime keeps its side of every connection; count the plugin's side only.
	deadline := time.Now().Add(5 * time.Second)
	for len(stubGoroutines()) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if left := stubGoroutines(); len(left) > 0 {
		t.Errorf("%d goroutines of NRI stubs left after %d attempts:\n%s", len(left), rt.registrations.Load(), strings.Join(left, "\n\n"))
	}
}

// stubGoroutines returns the stacks of goroutines running in an NRI stub.
func stubGoroutines() []string {
	buf := make([]byte, 4<<20)
	var out []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "nri/pkg/stub.(*stub)") {
			out = append(out, g)
		}
	}
	return out
}
