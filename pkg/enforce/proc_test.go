package enforce

import (
	"context"
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// sleeper starts a process that sleeps until killed, in cgroup cg.
func sleeper(t *testing.T, cg rt.Cgroup) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cg.Move(t, cmd.Process.Pid)
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// exited waits for the process to end and says whether SIGKILL ended it.
func exited(t *testing.T, cmd *exec.Cmd, within time.Duration) bool {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		return errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
	case <-time.After(within):
		return false
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestKillerRealProcesses: a process is killed only while it is in the cgroup it was seen in;
// one that has exited is reported gone.
func TestKillerRealProcesses(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	a, b := rt.NewCgroup(t, h), rt.NewCgroup(t, h)
	k := Killer{Cgroups: h}
	inA, inB := sleeper(t, a), sleeper(t, b)

	if err := k.Kill(inB.Process.Pid, a.Path); err == nil || !alive(inB.Process.Pid) {
		t.Fatalf("Kill of a process of %s as one of %s: %v (alive %v), want a refusal", b.Path, a.Path, err, alive(inB.Process.Pid))
	}
	if err := k.Kill(inA.Process.Pid, a.Path); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if !exited(t, inA, 10*time.Second) {
		t.Fatal("the process of a did not die of SIGKILL")
	}
	if err := k.Kill(inA.Process.Pid, a.Path); !errors.Is(err, ErrGone) {
		t.Errorf("Kill of a reaped process: %v, want ErrGone", err)
	}
	for _, cg := range []string{"", "/"} {
		if err := k.Kill(inB.Process.Pid, cg); err == nil {
			t.Errorf("Kill with cgroup %q accepted", cg)
		}
	}
	if !alive(inB.Process.Pid) {
		t.Error("the process of b died")
	}
}

// TestEnforcerRealProcesses runs the enforcer over real processes in real cgroups and a
// simulated GPU that reports what each holds: the container over its limit and the one with an
// unregistered process lose their processes on the GPU within the grace and a period, the
// simulated GPU frees what they held (as a real one does when a process dies), and the
// container within its limit is untouched.
func TestEnforcerRealProcesses(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	sim, uuids := simulatedGPUs(t, 1, "enforce-test")
	uuid := uuids[0]
	over, unreg, good := rt.NewCgroup(t, h), rt.NewCgroup(t, h), rt.NewCgroup(t, h)
	overP, unregP, goodP := sleeper(t, over), sleeper(t, unreg), sleeper(t, good)
	hold := func(cmd *exec.Cmd, bytes uint64) {
		if err := sim.SetProcessUsage(uuid, cmd.Process.Pid, bytes, nil); err != nil {
			t.Fatal(err)
		}
	}
	hold(overP, 3*GiB)
	hold(unregP, 512*MiB)
	hold(goodP, 900*MiB)
	target := func(key string, cg rt.Cgroup) Target {
		return Target{Key: key, Namespace: "ns", Pod: key, Container: "app", Claim: key, Cgroups: []string{cg.Path},
			Limits: map[string]uint64{uuid: 1 * GiB}, MustRegister: true}
	}
	targets := []Target{target("over", over), target("unreg", unreg), target("good", good)}
	registered := map[int]bool{overP.Process.Pid: true, goodP.Process.Pid: true}
	events := make(chan string, 10)
	e := New(Config{Period: 20 * time.Millisecond, Grace: 200 * time.Millisecond, SlackPerProcess: -1}, Deps{
		GPUs:       func() []string { return []string{uuid} },
		Targets:    func() []Target { return targets },
		Processes:  sim.ProcessMemory,
		CgroupOf:   registry.CgroupHierarchy(h).OfPID,
		Registered: func(pid int, _ string) bool { return registered[pid] },
		Kill:       Killer{Cgroups: h}.Kill,
		Event:      func(t Target, reason, _ string) { events <- t.Pod + " " + reason },
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)

	for _, cmd := range []*exec.Cmd{overP, unregP} {
		if !exited(t, cmd, 10*time.Second) {
			t.Fatalf("process %d was not killed", cmd.Process.Pid)
		}
	}
	got := map[string]bool{<-events: true, <-events: true}
	if !got["over VGPUMemoryLimitExceeded"] || !got["unreg VGPUUnregisteredProcess"] {
		t.Errorf("events %v", got)
	}
	time.Sleep(10 * e.cfg.Period)
	if !alive(goodP.Process.Pid) {
		t.Error("the container within its limit lost its process")
	}
	mem, err := sim.ProcessMemory(uuid)
	if err != nil || len(mem) != 1 || mem[0].PID != goodP.Process.Pid {
		t.Errorf("the simulated GPU's processes after the kills: %+v %v, want only the good one's", mem, err)
	}
	select {
	case ev := <-events:
		t.Errorf("another event: %s", ev)
	default:
	}
}
