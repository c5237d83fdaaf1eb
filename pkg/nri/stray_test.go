package nri

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// TestSynchronizeStopsStrays reproduces what containerd 2.4.2 (NRI 0.12.3) replays after the
// plugin was SIGKILLed under a CreateContainer (issue 16, the chaos suite): a running container
// with the claim's env and CDI devices and none of the plugin's adjustment. Synchronize must
// stop it, and only the containers the plugin would have adjusted.
func TestSynchronizeStopsStrays(t *testing.T) {
	c := testClaim(claimA, gpu0) // NRI path, reserved for podA
	perClaim := testClaim(claimB, gpu1)
	perClaim.Path = contract.PathPerClaim
	f := newFixture(t, c, perClaim)
	const podC = "90d00000-0000-4000-8000-00000000000c"
	f.claims.refresh = func(context.Context, string) ([]string, error) { return []string{podA, podC}, nil }
	var mu sync.Mutex
	var stopped []string
	f.plugin.cfg.StopProcess = func(pid int, id string) error {
		mu.Lock()
		defer mu.Unlock()
		stopped = append(stopped, fmt.Sprintf("%s/%d", id, pid))
		return nil
	}
	running := func(ctr *api.Container, pid uint32) *api.Container {
		ctr.State, ctr.Pid = api.ContainerState_CONTAINER_RUNNING, pid
		return ctr
	}
	adjusted := running(vgpuContainer("adjusted", pod(podA), "side", c, true), 10)
	d := f.dirs(claimA, podA, "side")
	adjusted.Env = append(adjusted.Env, contract.EnvPodUID+"="+podA, contract.EnvContainerName+"=side")
	adjusted.Mounts = []*api.Mount{{Source: d.Config, Destination: contract.ContainerConfigDir, Type: "bind"}}
	exited := vgpuContainer("exited", pod(podA), "old", c, true)
	exited.State, exited.Pid = api.ContainerState_CONTAINER_STOPPED, 0

	_, err := f.plugin.Synchronize(context.Background(), []*api.PodSandbox{pod(podA), pod(podB), pod(podC)}, []*api.Container{
		running(vgpuContainer("stray", pod(podA), "app", c, true), 11),           // created without us: stopped
		running(vgpuContainer("second-pod", pod(podC), "app", c, true), 12),      // reserved after an API read: stopped
		running(vgpuContainer("not-reserved", pod(podB), "app", c, true), 13),    // would be rejected, not adjusted
		running(vgpuContainer("forged", pod(podA), "env-only", c, false), 14),    // the claim's env without its CDI devices
		running(vgpuContainer("per-claim", pod(podA), "pc", perClaim, true), 15), // another path's claim
		adjusted, exited,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.plugin.cgroupReads.Wait()
	slices.Sort(stopped)
	if want := []string{"second-pod/12", "stray/11"}; !slices.Equal(stopped, want) {
		t.Errorf("stopped %v, want %v", stopped, want)
	}
	if n := f.counter("vgpu_dra_nri_stops_total", "", ""); n != 2 {
		t.Errorf("nri_stops_total %v, want 2", n)
	}
	if in, ok := f.plugin.Cache().Get("adjusted"); !ok || in.PID != 10 {
		t.Errorf("the adjusted container is not in the cache: %+v", in)
	}

	// A stop that fails is counted as an error and logged; the next Synchronize tries again.
	f.plugin.cfg.StopProcess = func(int, string) error { return errors.New("no such process") }
	before := f.counter("vgpu_dra_nri_errors_total", "hook", "synchronize")
	if _, err := f.plugin.Synchronize(context.Background(), []*api.PodSandbox{pod(podA)}, []*api.Container{
		running(vgpuContainer("stray", pod(podA), "app", c, true), 11),
	}); err != nil {
		t.Fatal(err)
	}
	f.plugin.cgroupReads.Wait()
	if n := f.counter("vgpu_dra_nri_errors_total", "hook", "synchronize"); n != before+1 {
		t.Errorf("nri_errors_total{synchronize} %v, want %v", n, before+1)
	}
}

// TestOnlyTheOwnerStopsStrays: at a handover (contract §14) only the instance that owns the node
// acts on the runtime's replay. An observer's Synchronize stops nothing, nor does Own, whose view
// may not hold the adjustment of a container the previous owner created an instant ago; the
// owner's next Synchronize, a replay the runtime vouches for, does.
func TestOnlyTheOwnerStopsStrays(t *testing.T) {
	c := testClaim(claimA, gpu0)
	f := newFixture(t, c)
	var mu sync.Mutex
	var stopped []string
	f.plugin.cfg.StopProcess = func(_ int, id string) error {
		mu.Lock()
		defer mu.Unlock()
		stopped = append(stopped, id)
		return nil
	}
	own := &switchOwnership{}
	f.plugin.SetOwnership(own, &memDecisions{marked: map[string]bool{}})
	stray := vgpuContainer("stray", pod(podA), "app", c, true)
	stray.State, stray.Pid = api.ContainerState_CONTAINER_RUNNING, 11
	replay := func() {
		t.Helper()
		if _, err := f.plugin.Synchronize(context.Background(), []*api.PodSandbox{pod(podA)}, []*api.Container{stray}); err != nil {
			t.Fatal(err)
		}
		f.plugin.cgroupReads.Wait()
	}
	stoppedNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(stopped)
	}

	replay()
	if got := stoppedNow(); len(got) != 0 {
		t.Fatalf("an observer stopped %v", got)
	}
	own.set(true)
	f.plugin.Own(f.claims)
	f.plugin.cgroupReads.Wait()
	if got := stoppedNow(); len(got) != 0 {
		t.Fatalf("Own stopped %v from its view", got)
	}
	replay()
	if got := stoppedNow(); !slices.Equal(got, []string{"stray"}) {
		t.Fatalf("the owner's Synchronize stopped %v, want [stray]", got)
	}
}

// TestStopContainerProcess kills a real process only when its cgroup names the container.
func TestStopContainerProcess(t *testing.T) {
	const id = "3f9a0c2b7e1d4a5f8b6c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c"
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	proc := t.TempDir()
	fakeCgroup := func(content string) {
		dir := filepath.Join(proc, fmt.Sprint(cmd.Process.Pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	fakeCgroup("12:pids:/kubepods/besteffort/pod1/0000aaaa\n0::/\n") // another container's process
	if err := StopContainerProcess(proc, cmd.Process.Pid, id); err == nil {
		t.Fatal("stopped a process in another container's cgroup")
	}
	select {
	case err := <-done:
		t.Fatalf("the process of another container died: %v", err)
	default:
	}

	fakeCgroup("12:pids:/kubepods/besteffort/pod1/" + id + "\n0::/\n")
	if err := StopContainerProcess(proc, cmd.Process.Pid, id); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := <-done; !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the container's process ended with %v, want SIGKILL", err)
	}
}
