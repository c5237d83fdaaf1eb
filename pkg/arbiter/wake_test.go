package arbiter

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// wakePass is one pass on GPU-a: a guaranteed share g (60) idle, a best-effort share be (10,
// ceiling 100) saturating, each with its config directory under root and g's core-limit
// directory wakeDir.
func wakePass(a *Arbiter, root, wakeDir string) {
	a.Divide("GPU-a", []Input{
		{Share: Share{Key: "g", Request: 60, Ceiling: 60, Util: 0}, ConfigDirs: []string{filepath.Join(root, "g")}, WakeDirs: []string{wakeDir}},
		{Share: Share{Key: "be", Class: BestEffort, Request: 10, Ceiling: 100, Util: 90}, ConfigDirs: []string{filepath.Join(root, "be")}},
	})
	a.EndPass()
}

func allowanceFile(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, contract.CoreAllowanceName))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func wakeSetup(t *testing.T) (*Arbiter, string, *time.Time, []string) {
	root := t.TempDir()
	for _, d := range []string{"g", "be", "lock"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Unix(1000, 0)
	var results []string
	a := New(nil)
	a.now = func() time.Time { return now }
	a.SetWakeHold(100*time.Millisecond, func(r string) { results = append(results, r) })
	wakePass(a, root, filepath.Join(root, "lock"))
	if got := allowanceFile(t, filepath.Join(root, "be")); got != "version 1\ngpu GPU-a 100" {
		t.Fatalf("before the wake the best-effort share has %q, want the whole GPU", got)
	}
	return a, root, &now, results
}

// TestWakeGivesAGuaranteedShareItsRequestAtOnce: a guaranteed share's wake re-divides its GPU
// at once: the best-effort share that had the idle time is down to what the guaranteed share's
// request leaves (40), the guaranteed share has its request and no more (a wake is no burst),
// and the next pass within the hold keeps that; after the hold the pass lends the time again.
func TestWakeGivesAGuaranteedShareItsRequestAtOnce(t *testing.T) {
	a, root, now, _ := wakeSetup(t)
	if r := a.Wake("g"); r != WakeTaken {
		t.Fatalf("wake: %s", r)
	}
	select {
	case <-a.Kicks():
	default:
		t.Fatal("a taken wake does not kick the pass goroutine")
	}
	a.Redivide()
	if got := allowanceFile(t, filepath.Join(root, "be")); got != "version 1\ngpu GPU-a 40" {
		t.Errorf("after the wake the best-effort share has %q, want 40", got)
	}
	if got, _ := a.Allowance("g", "GPU-a"); got != 60 {
		t.Errorf("the woken guaranteed share has %v, want its request 60", got)
	}
	*now = now.Add(50 * time.Millisecond)
	wakePass(a, root, filepath.Join(root, "lock")) // NVML has not seen its work yet
	if got, _ := a.Allowance("be", "GPU-a"); got != 40 {
		t.Errorf("a pass within the hold gives the best-effort share %v, want 40", got)
	}
	*now = now.Add(100 * time.Millisecond)
	wakePass(a, root, filepath.Join(root, "lock"))
	if got, _ := a.Allowance("be", "GPU-a"); got != 100 {
		t.Errorf("a pass after the hold, the guaranteed share idle: best-effort %v, want 100", got)
	}
}

// TestWakeCannotRaiseAShare: a best-effort share's wake changes nothing, a second wake within
// MinWakeInterval is dropped, and a target the last pass did not divide for is unknown.
func TestWakeCannotRaiseAShare(t *testing.T) {
	a, root, now, _ := wakeSetup(t)
	if r := a.Wake("be"); r != WakeTaken {
		t.Fatalf("wake: %s", r)
	}
	a.Redivide()
	if got := allowanceFile(t, filepath.Join(root, "be")); got != "version 1\ngpu GPU-a 100" {
		t.Errorf("a best-effort wake changed its file to %q", got)
	}
	if got := allowanceFile(t, filepath.Join(root, "g")); got != "version 1\ngpu GPU-a 60" {
		t.Errorf("a best-effort wake changed the guaranteed share's file to %q", got)
	}
	*now = now.Add(5 * time.Millisecond)
	if r := a.Wake("be"); r != WakeDropped {
		t.Errorf("a wake 5 ms after the last: %s, want %s", r, WakeDropped)
	}
	if r := a.Wake("gone"); r != WakeUnknown {
		t.Errorf("a wake of no target: %s, want %s", r, WakeUnknown)
	}
}

// TestWakeWatcher: the library's write of core.wake in a watched core-limit directory wakes
// its target through inotify, and the re-division follows.
func TestWakeWatcher(t *testing.T) {
	a, root, _, _ := wakeSetup(t)
	woken := make(chan string, 16)
	a.SetWakeHold(100*time.Millisecond, func(r string) { woken <- r })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := a.StartWaking(ctx); err != nil {
		t.Fatal(err)
	}
	wakePass(a, root, filepath.Join(root, "lock")) // the watch is set at the end of a pass
	if err := os.WriteFile(filepath.Join(root, "lock", contract.CoreWakeName), []byte{1}, 0o666); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-woken:
		if r != WakeTaken {
			t.Fatalf("the wake: %s, want %s", r, WakeTaken)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no wake from a write of core.wake")
	}
	<-a.Kicks()
	a.Redivide()
	if got := allowanceFile(t, filepath.Join(root, "be")); got != "version 1\ngpu GPU-a 40" {
		t.Errorf("after the watched wake the best-effort share has %q, want 40", got)
	}
}
