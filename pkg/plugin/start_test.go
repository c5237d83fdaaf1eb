package plugin

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/instancelock"
)

const (
	testNode  = "node-1"
	testClaim = "0f6c2a8e-4b1d-4c3a-9e2f-7a5b6c8d9e01"
)

// testConfig is a node laid out under a short temp dir (unix socket paths stay under 100 bytes),
// with NRI on and every endpoint on a free loopback port.
func testConfig(t *testing.T) Config {
	t.Helper()
	root, err := os.MkdirTemp("/tmp", "vgp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	return Config{
		NodeName: testNode, DriverName: contract.DefaultDriverName,
		StateDir: filepath.Join(root, "state"), KubeletDir: filepath.Join(root, "kubelet"),
		CDIDir: filepath.Join(root, "cdi"), DeviceSource: "simulated:dgx-h200:1",
		GPUInjection: cdi.InjectionNone, VGPU: true, NRI: true, HealthCheck: true,
		NRISocket: filepath.Join(root, "nri.sock"), HealthAddress: "127.0.0.1:0", MetricsAddress: "127.0.0.1:0",
	}
}

func testDeps() Deps {
	return Deps{KubeClient: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}), BootID: "boot-1"}
}

// busyPort is a loopback address something already listens on.
func busyPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l.Addr().String()
}

func mustWriteFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestStartFailureAtEachStepLeavesNothingStarted makes each step of Start fail in turn and checks
// that Start names the step and leaves nothing behind: the instance lock is free, no registry
// socket answers, and no goroutine of the half-built plugin is left running.
func TestStartFailureAtEachStepLeavesNothingStarted(t *testing.T) {
	steps := []struct {
		name    string
		breakIt func(t *testing.T, c *Config)
		want    string
	}{
		{"GPU inventory", func(_ *testing.T, c *Config) { c.DeviceSource = "simulated:no-such-profile" }, "open GPU source"},
		{"checkpoint", func(t *testing.T, c *Config) { mustWriteFile(t, c.CheckpointPath(), "{not json") }, "checkpoint"},
		{"driver (CDI dir)", func(t *testing.T, c *Config) {
			mustWriteFile(t, filepath.Join(c.StateDir, "blocker"), "")
			c.CDIDir = filepath.Join(c.StateDir, "blocker", "cdi")
		}, "cdi"},
		{"recovery", func(t *testing.T, c *Config) {
			store, err := checkpoint.Open(mkdirFor(t, c.CheckpointPath()))
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Update(func(d *checkpoint.Data) error {
				d.Claims[testClaim] = checkpoint.Claim{Namespace: "ns", Name: "c", State: checkpoint.PrepareCompleted, Path: contract.PathNRI}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			mustWriteFile(t, c.Layout().ClaimsRoot(), "not a directory")
		}, "recover prepared claims"},
		{"NRI debug endpoint", func(_ *testing.T, c *Config) { c.DebugSocket = filepath.Join(c.StateDir, "missing", "debug.sock") }, "debug"},
		{"registry", func(t *testing.T, c *Config) { mustWriteFile(t, c.Layout().RegistryDir(), "not a directory") }, "registry"},
		{"kubelet services", func(t *testing.T, c *Config) { mustWriteFile(t, c.RegistrarDir(), "not a directory") }, "kubelet plugin directory"},
		{"simulated-GPU control socket", func(t *testing.T, c *Config) {
			mustWriteFile(t, filepath.Join(c.SimulatedControlSocketPath(), "in-the-way"), "")
		}, "simulated-GPU control socket"},
		{"health endpoint", func(t *testing.T, c *Config) { c.HealthAddress = busyPort(t) }, "health"},
		{"metrics endpoint", func(t *testing.T, c *Config) { c.MetricsAddress = busyPort(t) }, "metrics"},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			cfg := testConfig(t)
			step.breakIt(t, &cfg)
			before := runtime.NumGoroutine()
			p, err := Start(context.Background(), cfg, testDeps())
			if err == nil {
				p.Stop()
				t.Fatalf("Start succeeded with a broken %s", step.name)
			}
			if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(step.want)) {
				t.Errorf("error %q does not name the step (%q)", err, step.want)
			}
			assertNothingStarted(t, cfg, before)
		})
	}
}

// TestStartAndStop: a plugin that started serves its registry socket and holds the lock; Stop
// releases both and ends its goroutines.
func TestStartAndStop(t *testing.T) {
	cfg := testConfig(t)
	before := runtime.NumGoroutine()
	p, err := Start(context.Background(), cfg, testDeps())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := net.Dial("unix", cfg.Layout().RegistrySocket()); err != nil {
		t.Errorf("registry socket does not answer while the plugin runs: %v", err)
	}
	if p.HealthAddr() == nil || p.MetricsAddr() == nil {
		t.Errorf("health %v, metrics %v: want both bound", p.HealthAddr(), p.MetricsAddr())
	}
	p.Stop()
	p.Stop() // twice is safe
	assertNothingStarted(t, cfg, before)
}

func mkdirFor(t *testing.T, path string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	return path
}

func assertNothingStarted(t *testing.T, cfg Config, goroutinesBefore int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	lock, err := instancelock.Acquire(ctx, cfg.InstanceLockPath())
	if err != nil {
		t.Errorf("instance lock still held: %v", err)
	} else {
		_ = lock.Release()
	}
	if c, err := net.Dial("unix", cfg.Layout().RegistrySocket()); err == nil {
		_ = c.Close()
		t.Error("the registry socket still answers")
	} else if !errors.Is(err, os.ErrNotExist) && !strings.Contains(err.Error(), "connection refused") && !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("dial registry socket: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > goroutinesBefore && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutinesBefore {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines left running (before Start: %d):\n%s", n, goroutinesBefore, buf[:runtime.Stack(buf, true)])
	}
}
