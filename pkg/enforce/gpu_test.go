//go:build gpu

package enforce

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// TestEnforcerOnGPU is the wall on a real GPU (hack/gpu-check.sh; build tag gpu, never in CI):
// the command in $GPU_CHECK_BYPASS (gpu_check bypass, preloaded with the library and its limit)
// allocates past its limit through libc's own dlsym, around the library; the enforcer, reading
// the real driver's per-process memory through NVML, kills it within the grace plus a period
// and a margin for NVML's lag. $GPU_CHECK_UUID is the GPU, $GPU_CHECK_LIMIT_MIB the limit.
func TestEnforcerOnGPU(t *testing.T) {
	cmdline, uuid := os.Getenv("GPU_CHECK_BYPASS"), os.Getenv("GPU_CHECK_UUID")
	limitMiB, err := strconv.ParseUint(os.Getenv("GPU_CHECK_LIMIT_MIB"), 10, 64)
	if cmdline == "" || uuid == "" || err != nil {
		t.Fatalf("set GPU_CHECK_BYPASS, GPU_CHECK_UUID and GPU_CHECK_LIMIT_MIB (hack/gpu-check.sh does)")
	}
	src, err := gpu.NewNVML()
	if err != nil {
		t.Fatalf("NVML: %v", err)
	}
	h := rt.Hierarchies(t)[0]
	cg := rt.NewCgroup(t, h)
	target := Target{Key: "gpu-check", Namespace: "gpu-check", Pod: "gpu-check", Container: "app", Claim: "gpu-check",
		Cgroups: []string{cg.Path}, Limits: map[string]uint64{uuid: limitMiB << 20}}
	killed := make(chan time.Time, 1)
	e := New(Config{}, Deps{
		GPUs:       func() []string { return []string{uuid} },
		Targets:    func() []Target { return []Target{target} },
		Processes:  src.ProcessMemory,
		CgroupOf:   h.OfPID,
		Registered: func(int, string) bool { return true },
		Kill: func(pid int, cgroup string) error {
			err := Killer{Cgroups: h}.Kill(pid, cgroup)
			select {
			case killed <- time.Now():
			default:
			}
			return err
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)

	// The command starts stopped in the test's cgroup: sh moves itself there first.
	cmd := exec.Command("sh", "-c", "echo $$ > "+cg.Dir()+"/cgroup.procs && exec "+cmdline)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var allocated time.Time
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		t.Logf("gpu_check: %s", sc.Text())
		if strings.HasPrefix(sc.Text(), "bypass_alloc=") {
			if sc.Text() != "bypass_alloc=0" {
				t.Fatalf("the allocation around the library failed (%s): the bypass was not tried", sc.Text())
			}
			allocated = time.Now()
			break
		}
	}
	if allocated.IsZero() {
		t.Fatal("gpu_check never allocated")
	}
	bound := e.Config().Grace + e.Config().Period + time.Second // NVML's per-process figure lags
	select {
	case at := <-killed:
		reaction := at.Sub(allocated)
		t.Logf("killed %v after the allocation around the library (bound %v)", reaction.Round(time.Millisecond), bound)
		if reaction > bound {
			t.Errorf("killed after %v, past the bound %v", reaction, bound)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the process past its limit of %d MiB was not killed within 30 s", limitMiB)
	}
}
