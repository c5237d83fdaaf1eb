package enforce

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// freezers are the freezers this machine has: the one beside the node's default hierarchy
// (cgroup v1 freezer beside v1 pids, or v2 itself) and, on a hybrid machine, v2's too.
func freezers(t *testing.T) []struct {
	name string
	h    registry.CgroupHierarchy
	f    CgroupFreezer
} {
	t.Helper()
	var out []struct {
		name string
		h    registry.CgroupHierarchy
		f    CgroupFreezer
	}
	for _, h := range rt.Hierarchies(t) {
		fh, v1, err := registry.FreezerHierarchy("/proc", h)
		if err != nil {
			t.Fatalf("freezer of %s: %v", h, err)
		}
		name := "v2"
		if v1 {
			name = "v1"
		}
		out = append(out, struct {
			name string
			h    registry.CgroupHierarchy
			f    CgroupFreezer
		}{name, fh, CgroupFreezer{Dir: fh.Dir, V1: v1}})
	}
	return out
}

// spinner starts a process that burns CPU until killed, in cgroup cg. Its cleanup thaws cg
// first: on cgroup v1 a frozen process dies only once thawed.
func spinner(t *testing.T, cg rt.Cgroup, f CgroupFreezer) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cg.Move(t, cmd.Process.Pid)
	t.Cleanup(func() {
		_ = f.Freeze(cg.Path, false)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// cpuTicks is the process's user plus system time, in clock ticks.
func cpuTicks(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from 3 (state) on
	utime, err1 := strconv.ParseUint(fields[11], 10, 64)
	stime, err2 := strconv.ParseUint(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("parse %s: %v %v", s, err1, err2)
	}
	return utime + stime
}

// waitFrozen waits until the freezer says the cgroup's processes are all stopped.
func waitFrozen(t *testing.T, f CgroupFreezer, cg string) {
	t.Helper()
	dir, err := f.Dir(cg)
	if err != nil {
		t.Fatal(err)
	}
	file, want := "cgroup.events", "frozen 1"
	if f.V1 {
		file, want = "freezer.state", "FROZEN"
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s of %s is %q, never %q", file, cg, b, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFreezerRealProcesses: a frozen cgroup's process uses no CPU at all; thawed, it runs
// again; the root cgroup is refused.
func TestFreezerRealProcesses(t *testing.T) {
	for _, fz := range freezers(t) {
		t.Run(fz.name, func(t *testing.T) {
			cg := rt.NewCgroup(t, fz.h)
			cmd := spinner(t, cg, fz.f)
			pid := cmd.Process.Pid

			if err := fz.f.Freeze(cg.Path, true); err != nil {
				t.Fatal(err)
			}
			waitFrozen(t, fz.f, cg.Path)
			before := cpuTicks(t, pid)
			time.Sleep(300 * time.Millisecond)
			if after := cpuTicks(t, pid); after != before {
				t.Fatalf("frozen, the spinner still ran: %d → %d ticks", before, after)
			}
			if err := fz.f.Freeze(cg.Path, false); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for cpuTicks(t, pid) == before {
				if time.Now().After(deadline) {
					t.Fatal("thawed, the spinner never ran again")
				}
				time.Sleep(20 * time.Millisecond)
			}
			for _, root := range []string{"", "/"} {
				if err := fz.f.Freeze(root, true); err == nil {
					t.Errorf("Freeze(%q) accepted", root)
				}
			}
			if err := fz.f.Freeze(cg.Path+"/gone", true); err == nil {
				t.Error("Freeze of a cgroup that does not exist succeeded")
			}
		})
	}
}

// cpuMeter reports a process's CPU use as the SM utilisation of a simulated GPU: what the
// throttle slows down is the process's CPU threads, which are what launch its kernels.
type cpuMeter struct {
	mu    sync.Mutex
	pid   int
	ticks uint64
	at    time.Time
	hz    float64
}

func (m *cpuMeter) utilization(t *testing.T) func(string, uint64) ([]gpu.ProcessSample, error) {
	return func(string, uint64) ([]gpu.ProcessSample, error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		now, ticks := time.Now(), cpuTicks(t, m.pid)
		if m.at.IsZero() {
			m.at, m.ticks = now, ticks
			return nil, nil
		}
		pct := 100 * float64(ticks-m.ticks) / m.hz / now.Sub(m.at).Seconds()
		m.at, m.ticks = now, ticks
		return []gpu.ProcessSample{{PID: m.pid, SMUtil: uint32(min(100, pct)), TimeStamp: uint64(now.UnixMicro())}}, nil
	}
}

// TestThrottleRealProcess runs the throttle over a real process in a real cgroup and a real
// freezer, its CPU use standing in for its SM utilisation: the spinner, which would use a whole
// core, is held under its limit of 10% plus the margin once throttled, on a loaded node too (at
// the default period: a loaded node's scheduling delays are a small part of it).
func TestThrottleRealProcess(t *testing.T) {
	// As a container runtime does on cgroup v1, the process is in a cgroup of the same path in
	// the pids hierarchy (where the enforcer finds it) and in the freezer's (where it freezes).
	h, fz := rt.Hierarchies(t)[0], freezers(t)[0]
	cg := rt.NewCgroup(t, h)
	fcg := cg
	if fz.f.V1 {
		fcg = rt.Cgroup{H: fz.h, Path: cg.Path}
		if err := os.Mkdir(fcg.Dir(), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(fcg.Dir()) })
	}
	cmd := spinner(t, fcg, fz.f)
	pid := cmd.Process.Pid
	if fz.f.V1 {
		cg.Move(t, pid)
	}
	const limit = 10
	meter := &cpuMeter{pid: pid, hz: 100} // USER_HZ is 100 on every Linux ABI Go supports
	var mu sync.Mutex
	actions := map[string]int{}
	target := Target{Key: "spin", Namespace: "ns", Pod: "spin", Container: "app", Claim: "c", Cgroups: []string{cg.Path},
		CoreLimits: map[string]uint32{gpuA: limit}}
	e := New(Config{Cores: CoreThrottle, CoreMargin: 10, CoreWindow: time.Second}, Deps{ // the default period
		GPUs:        func() []string { return []string{gpuA} },
		Targets:     func() []Target { return []Target{target} },
		Processes:   func(string) ([]gpu.ProcessMemory, error) { return nil, nil },
		Utilization: meter.utilization(t),
		CgroupOf:    h.OfPID,
		Freeze:      fz.f.Freeze,
		Event: func(_ Target, reason, _ string) {
			mu.Lock()
			actions[reason]++
			mu.Unlock()
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	time.Sleep(3 * time.Second) // the window, the first throttle, the duty settling
	start, at := cpuTicks(t, pid), time.Now()
	time.Sleep(3 * time.Second)
	used := 100 * float64(cpuTicks(t, pid)-start) / 100 / time.Since(at).Seconds()
	t.Logf("throttled to a limit of %d%%, the spinner used %.1f%% of a core", limit, used)
	mu.Lock()
	throttles := actions["VGPUCoreLimitExceeded"]
	mu.Unlock()
	if throttles != 1 {
		t.Errorf("%d throttle events, want 1", throttles)
	}
	if used > limit+10 { // the margin
		t.Errorf("the spinner used %.1f%% of a core, want at most %d%% (its limit and a margin)", used, limit+10)
	}
	cancel()
	<-done
	dir, _ := fz.f.Dir(cg.Path)
	file, thawed := "cgroup.events", "frozen 0"
	if fz.f.V1 {
		file, thawed = "freezer.state", "THAWED"
	}
	if b, err := os.ReadFile(filepath.Join(dir, file)); err != nil || !strings.Contains(string(b), thawed) {
		t.Errorf("after the enforcer stopped, %s is %q (%v), want %s", file, b, err, thawed)
	}
}
