package plugin

import (
	"context"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/handover"
	"github.com/vgpu-dra/vgpu-dra/pkg/instancelock"
)

const (
	testPodOld = "0a0a0a0a-0000-4000-8000-0000000000a1"
	testPodNew = "0b0b0b0b-0000-4000-8000-0000000000b1"
)

// waitUntil polls cond; the bound turns a hang into a failure, it asserts no timing.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestTakeOverFailureAtEachStepLeavesTheOldOwnerServing extends the start-up test to the other
// way of becoming the owner (contract §14): a successor that takes the lock at a handover and
// then fails at a step of building the owner's parts releases the lock and everything it
// started; the old instance takes the node back and serves (its registry socket answers, it
// holds the lock and its record is in the file); the successor stays an observer, not ready.
func TestTakeOverFailureAtEachStepLeavesTheOldOwnerServing(t *testing.T) {
	steps := []struct {
		name    string
		breakIt func(t *testing.T, c *Config)
		want    string
	}{
		{"driver (CDI dir)", func(t *testing.T, c *Config) {
			mustWriteFile(t, filepath.Join(c.StateDir, "blocker"), "")
			c.CDIDir = filepath.Join(c.StateDir, "blocker", "cdi")
		}, "cdi"},
		{"NRI debug endpoint", func(_ *testing.T, c *Config) { c.DebugSocket = filepath.Join(c.StateDir, "missing", "debug.sock") }, "debug"},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.PodUID = testPodOld
			before := runtime.NumGoroutine()
			old, err := Start(context.Background(), cfg, testDeps())
			if err != nil {
				t.Fatal(err)
			}
			defer old.Stop()
			broken := cfg
			broken.PodUID = testPodNew
			step.breakIt(t, &broken)
			succ, err := Start(context.Background(), broken, testDeps())
			if err != nil {
				t.Fatalf("a successor starts as an observer whatever its configuration: %v", err)
			}
			waitUntil(t, "the successor's failed takeover", func() bool {
				return strings.Contains(strings.ToLower(succ.Ownership().Waiting), step.want)
			})
			waitUntil(t, "the old instance to own the node again", old.Owner)
			if succ.Owner() {
				t.Fatal("the successor owns the node")
			}
			if err := succ.readiness(context.Background()); err == nil {
				t.Error("the successor is ready although it could not take over")
			}
			rec, ok := handover.ParseRecord(instancelock.ReadHolder(cfg.InstanceLockPath()).Record)
			if !ok || rec.PodUID != testPodOld {
				t.Errorf("the lock's record after the failed takeover: %+v, want the old pod's", rec)
			}
			if c, err := net.Dial("unix", cfg.Layout().RegistrySocket()); err != nil {
				t.Errorf("the old owner's registry socket: %v", err)
			} else {
				_ = c.Close()
			}
			if got := counter(t, old, "vgpu_dra_handover_events_total", "owner_gone"); got != 1 {
				t.Errorf("the old instance took the node back %v times, want 1", got)
			}
			succ.Stop()
			old.Stop()
			assertNothingStarted(t, cfg, before)
		})
	}
}

func counter(t *testing.T, p *Plugin, name, event string) float64 {
	t.Helper()
	families, err := p.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == event {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
