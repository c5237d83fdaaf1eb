package registry_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// TestRegisteredProcesses: the server records the processes it answered OK (their PIDs as
// SO_PEERCRED gave them), which the enforcer asks about. A process of the same container that
// never registered is not one, even when a sibling's registration listed it in pids.config; a
// process older than the server (one that registered with an earlier plugin instance) is one
// when pids.config lists it.
func TestRegisteredProcesses(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	ctr := rt.NewCgroup(t, h)
	dir := configDir(t, shortDir(t), "c")
	cs := newContainers()
	cs.set(podA, "app", registry.Container{ConfigDir: dir, Cgroup: ctr.Path}, true)
	// The test binary started before the server (by more than the 10 ms of a clock tick, which
	// the start times are counted in): it stands for a process that registered with the
	// instance before this one.
	time.Sleep(30 * time.Millisecond)
	s := startServer(t, registry.Config{}, registry.Deps{Containers: cs, Cgroups: &h})
	req := registry.Request{PodUID: podA, ContainerName: "app"}

	bypasser := rt.StartChild(t, ctr, rt.Spec{}) // in the container, never registers
	reg := rt.StartChild(t, ctr, rt.Spec{Socket: s.Socket(), Count: 1, Request: req})
	if rep := reg.Report(t); rep.Statuses[0] != "OK" {
		t.Fatalf("registration: %s %s", rep.Statuses[0], rep.Messages[0])
	}
	listed := readPIDs(t, dir)
	if !slices.Contains(listed, bypasser.PID) || !slices.Contains(listed, reg.PID) {
		t.Fatalf("pids.config %v, want both processes of the container", listed)
	}
	if !s.Registered(reg.PID, dir) || !s.Registered(reg.PID, "") {
		t.Errorf("the process answered OK is not registered")
	}
	if s.Registered(bypasser.PID, dir) {
		t.Errorf("a process that never registered counts as registered because a sibling's registration listed it")
	}
	self := os.Getpid()
	if s.Registered(self, dir) {
		t.Errorf("a process older than the server that pids.config does not list counts as registered")
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.config"), []byte(fmt.Sprintf("%d\n%d\n", reg.PID, self)), 0o644); err != nil {
		t.Fatal(err)
	}
	if !s.Registered(self, dir) {
		t.Errorf("a process older than the server that its container's pids.config lists is not registered")
	}
	reg.Stop()
	if s.Registered(reg.PID, dir) {
		t.Errorf("a process that exited is still registered")
	}
}

// TestProcessStartTicks reads field 22 of a stat line whose command name holds spaces and
// parentheses, and refuses a malformed one.
func TestProcessStartTicks(t *testing.T) {
	proc := t.TempDir()
	write := func(pid, content string) {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "stat"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("7", "7 (a) (b c) S 1 7 7 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10\n")
	write("8", "8 (x) S 1 2 3\n")
	if got, err := registry.ProcessStartTicks(proc, 7); err != nil || got != 123456 {
		t.Errorf("ProcessStartTicks = %d, %v; want 123456", got, err)
	}
	if _, err := registry.ProcessStartTicks(proc, 8); err == nil {
		t.Error("a short stat line accepted")
	}
	if _, err := registry.ProcessStartTicks(proc, 9); err == nil {
		t.Error("a missing process accepted")
	}
}
