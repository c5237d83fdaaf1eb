//go:build escape

package escape

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

const gpuUUID = "GPU-e5ca9e00-0000-4000-8000-000000000001"

// node is the node side of the suite, all of it real code of the plugin: the registry server
// (pkg/registry) answering the library on a real unix socket and recording who registered,
// and the enforcer (pkg/enforce) with its default period, grace and slack, reading the GPU
// through the plugin's NVML reader (pkg/gpu) over the library test suite's fake
// libnvidia-ml.so.1, whose per-process figures are what the fake libcuda.so.1 in the
// containers really allocated. Containers are matched by cgroup, processes killed by pidfd.
type node struct {
	dir, build, fakeDir, tenantDir, libvgpu, preloadFile, registryDir, gpuDir string

	cgroups   registry.CgroupHierarchy
	cgroupDir string // this run's parent cgroup, on the host
	gpus      gpu.Source
	registry  *registry.Server
	enforcer  *enforce.Enforcer
	rec       *recorder

	mu        sync.Mutex
	sandboxes map[string]*sandbox // by pod UID
}

func startNode(ctx context.Context, dir, build, tenantDir string) (*node, error) {
	n := &node{dir: dir, build: build, fakeDir: filepath.Join(build, "test", "fake"), tenantDir: tenantDir,
		libvgpu: filepath.Join(build, "libvgpu.so"), registryDir: filepath.Join(dir, "registry"),
		gpuDir: filepath.Join(dir, "gpu"), sandboxes: map[string]*sandbox{}, rec: &recorder{}}
	n.preloadFile = filepath.Join(dir, "ld.so.preload")
	for _, d := range []string{n.registryDir, n.gpuDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(n.gpuDir, 0o777); err != nil {
		return nil, err
	}
	if err := os.WriteFile(n.preloadFile, []byte(contract.ContainerLibraryPath+"\n"), 0o644); err != nil {
		return nil, err
	}
	// The fake driver's state: the harness's NVML reads the file the containers' driver writes.
	os.Setenv("FAKE_GPU_STATE", filepath.Join(n.gpuDir, "gpu.state"))
	os.Setenv("FAKE_GPU_DEVICES", gpuUUID+":16384")
	var err error
	if n.cgroups, err = registry.DetectCgroupHierarchy("/proc"); err != nil {
		return nil, err
	}
	n.cgroupDir = filepath.Join(n.cgroups.Mount, fmt.Sprintf("vgpu-escape-%d", os.Getpid()))
	if err := os.Mkdir(n.cgroupDir, 0o755); err != nil {
		return nil, fmt.Errorf("create the suite's cgroup: %w", err)
	}
	if n.gpus, err = gpu.NewNVMLAt(filepath.Join(n.fakeDir, "libnvidia-ml.so.1")); err != nil {
		return nil, err
	}
	if n.registry, err = registry.Start(ctx, registry.Config{Socket: filepath.Join(n.registryDir, contract.RegistrySocketName)},
		registry.Deps{Containers: n, Cgroups: &n.cgroups}); err != nil {
		return nil, err
	}
	n.enforcer = enforce.New(enforce.Config{}, enforce.Deps{
		Ready:      func() bool { return true },
		GPUs:       func() []string { return []string{gpuUUID} },
		Targets:    n.targets,
		Processes:  n.gpus.ProcessMemory,
		CgroupOf:   n.cgroups.OfPID,
		Registered: n.registry.Registered,
		Kill:       enforce.Killer{Cgroups: n.cgroups}.Kill,
		Metrics:    n.rec,
	})
	go n.enforcer.Run(ctx)
	return n, nil
}

func (n *node) stop() {
	n.registry.Stop()
	// Sandboxes' cgroups are removed by their tests; the parent goes last.
	_ = os.Remove(n.cgroupDir)
}

func (n *node) newCgroup(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(n.cgroupDir, name)
	must(t, os.Mkdir(dir, 0o755))
	t.Cleanup(func() {
		for i := 0; i < 100; i++ { // the killed processes may take a moment to leave
			if os.Remove(dir) == nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("remove cgroup %s: still in use", dir)
	})
	rel, err := filepath.Rel(n.cgroups.Mount, dir)
	must(t, err)
	return filepath.Join(n.cgroups.Root, rel)
}

func (n *node) cgroupProcs(cgroup string) string {
	rel, _ := filepath.Rel(n.cgroups.Root, cgroup)
	return filepath.Join(n.cgroups.Mount, rel, "cgroup.procs")
}

func (n *node) add(s *sandbox) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sandboxes[s.podUID] = s
}

func (n *node) remove(s *sandbox) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.sandboxes, s.podUID)
}

// Synced and Container resolve the library's registrations, as the NRI cache does.
func (n *node) Synced() bool { return true }

func (n *node) Container(pod, name string) (registry.Container, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s, ok := n.sandboxes[pod]
	if !ok || name != "app" {
		return registry.Container{}, false
	}
	return registry.Container{ID: s.name, ConfigDir: s.configDir(), Cgroup: s.cgroup}, true
}

func (n *node) targets() []enforce.Target {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []enforce.Target
	for _, s := range n.sandboxes {
		out = append(out, enforce.Target{Key: s.name, Namespace: "escape", Pod: s.name, PodUID: s.podUID, Container: "app",
			Claim: "claim-" + s.name, Cgroups: []string{s.cgroup}, ConfigDir: s.configDir(),
			Limits: map[string]uint64{gpuUUID: s.limit}, MustRegister: true})
	}
	return out
}

// usage is what the GPU says the sandbox's processes hold: the sum and the number of
// processes, matched by cgroup as the enforcer matches them.
func (n *node) usage(s *sandbox) (sum uint64, procs int) {
	list, err := n.gpus.ProcessMemory(gpuUUID)
	if err != nil {
		return 0, 0
	}
	for _, p := range list {
		cg, err := n.cgroups.OfPID(p.PID)
		if err == nil && (cg == s.cgroup || strings.HasPrefix(cg, s.cgroup+"/")) {
			sum += p.UsedBytes
			procs++
		}
	}
	return sum, procs
}

// recorder keeps the enforcer's actions and reaction times.
type recorder struct {
	mu        sync.Mutex
	actions   map[string]int
	reactions []time.Duration
}

func (r *recorder) Action(action, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.actions == nil {
		r.actions = map[string]int{}
	}
	r.actions[action+"/"+reason]++
}

func (r *recorder) Reaction(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reactions = append(r.reactions, d)
}

func (r *recorder) Pass(time.Duration) {}
func (r *recorder) Foreign(int)        {}
func (r *recorder) ReadError()         {}
func (r *recorder) Throttled(int)      {}

// snapshot returns copies of the counts and reactions so far.
func (r *recorder) snapshot() (map[string]int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.actions {
		out[k] = v
	}
	return out, len(r.reactions)
}

func (r *recorder) reactionsSince(i int) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.reactions[i:]...)
}
