package registry_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

const (
	podA  = "0b5a1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"
	podB  = "1c6b2d3e-4f5a-4b6c-9d7e-8f9a0b1c2d3e"
	uuidR = "2d7c3e4f-5a6b-4c7d-ae8f-9a0b1c2d3e4f"
	claim = "3e8d4f5a-6b7c-4d8e-bf9a-0b1c2d3e4f5a"
)

// containers is a ContainerResolver the tests fill.
type containers struct {
	mu     sync.Mutex
	synced bool
	byKey  map[string]registry.Container
	hook   func(pod string) // runs inside Container (to block or panic)
}

func newContainers() *containers { return &containers{byKey: map[string]registry.Container{}} }

func (c *containers) Synced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
}

func (c *containers) Container(pod, name string) (registry.Container, bool) {
	c.mu.Lock()
	hook := c.hook
	ctr, ok := c.byKey[pod+"/"+name]
	c.mu.Unlock()
	if hook != nil {
		hook(pod)
	}
	return ctr, ok
}

func (c *containers) set(pod, name string, ctr registry.Container, synced bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byKey[pod+"/"+name] = ctr
	c.synced = synced
}

// claims is a ClaimResolver the tests fill.
type claims map[string]registry.Claim

func (c claims) ClaimByRegisterUUID(uuid string) (registry.Claim, bool) {
	cl, ok := c[uuid]
	return cl, ok
}

// shortDir is a temp dir with a short path (unix sockets need < 108 bytes).
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("/tmp", "vgr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// configDir makes a container config dir the way claimdir does (0755, root).
func configDir(t testing.TB, root, name string) string {
	t.Helper()
	d := filepath.Join(root, name, "config")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func startServer(t testing.TB, cfg registry.Config, deps registry.Deps) *registry.Server {
	t.Helper()
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(shortDir(t), "registry", "registry.sock")
	}
	s, err := registry.Start(context.Background(), cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// readPIDs reads pids.config and checks its format (contract §6).
func readPIDs(t testing.TB, dir string) []int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "pids.config"))
	if err != nil {
		t.Fatalf("read pids.config: %v", err)
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		t.Fatalf("pids.config %q does not end in a newline", b)
	}
	var pids []int
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		p, err := strconv.Atoi(l)
		if err != nil || p <= 0 || strconv.Itoa(p) != l {
			t.Fatalf("pids.config line %q is not a decimal PID", l)
		}
		pids = append(pids, p)
	}
	if !slices.IsSorted(pids) || len(slices.Compact(slices.Clone(pids))) != len(pids) {
		t.Fatalf("pids.config %v is not strictly ascending", pids)
	}
	return pids
}

func sorted(p ...int) []int {
	slices.Sort(p)
	return p
}
