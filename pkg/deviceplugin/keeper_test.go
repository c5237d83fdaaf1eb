package deviceplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestKeeper: after a reboot (directories gone) the sets the kubelet's containers hold are
// rebuilt with their vgpu.config; a set no one holds is removed once its grace has passed since
// the start and since its last Allocate, and three answers over 10 s have missed it, not
// before; a directory that is no share's stays.
func TestKeeper(t *testing.T) {
	inv := testInventory(t, 2, 2)
	a, layout := newTestAllocator(t, inv, 0, cdi.InjectionNone)
	clock := &fakeClock{now: time.Unix(1000, 0)}
	a.now = clock.Now
	k := &fakeKubelet{}
	kp := &keeper{alloc: a, holders: &holders{kubelet: k, resource: resource}, grace: 15 * time.Second, started: clock.Now(), logger: logr.Discard()}
	configOf := func(uid string) string {
		d, _ := layout.PerClaimDirs(uid)
		return filepath.Join(d.Config, contract.ContainerConfigName)
	}
	leadHeld, leadFree := inv.byID[id(0, 1)], inv.byID[id(1, 0)]

	// A container holds two shares (lead 0::1) whose directories a reboot took.
	k.set(fakePod{"ns", "a", resource, ids([2]int{1, 1}, [2]int{0, 1})})
	if err := kp.pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(configOf(leadHeld.UID))
	if err != nil {
		t.Fatalf("held set not rebuilt: %v", err)
	}
	cfg, err := contract.ParseContainerConfig(data)
	if err != nil || cfg.RegisterUUID != leadHeld.UID || len(cfg.GPUs) != 2 {
		t.Fatalf("rebuilt vgpu.config %+v, %v", cfg, err)
	}
	// A rebuilt set is not reset: what its container wrote stays.
	d, _ := layout.PerClaimDirs(leadHeld.UID)
	ledger := filepath.Join(d.VMemNode, "ledger.v2")
	if err := os.WriteFile(ledger, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Another share was allocated, and no container holds it (yet, or any more).
	if _, err := a.allocate([]string{leadFree.ID}); err != nil {
		t.Fatal(err)
	}
	clock.add(20 * time.Second) // past the start's grace, within nothing else
	if _, err := a.allocate([]string{leadFree.ID}); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(layout.ClaimsRoot(), uidA)
	if err := os.MkdirAll(foreign, 0o700); err != nil {
		t.Fatal(err)
	}
	clock.add(10 * time.Second) // 10 s after the last Allocate: within its grace
	if err := kp.pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(configOf(leadFree.UID)); err != nil {
		t.Fatalf("a set allocated 10 s ago was removed: %v", err)
	}
	clock.add(6 * time.Second) // past its grace, but missed by two answers only
	if err := kp.pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(configOf(leadFree.UID)); err != nil {
		t.Fatalf("a set two answers missed, 6 s apart, was removed: %v", err)
	}
	clock.add(5 * time.Second) // the third miss, 11 s after the first
	if err := kp.pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	uids, _ := layout.ListClaims()
	if slices.Contains(uids, leadFree.UID) {
		t.Error("a set no one holds survived its grace")
	}
	if !slices.Contains(uids, leadHeld.UID) || !slices.Contains(uids, uidA) {
		t.Errorf("claim dirs %v: the held set or a foreign directory went", uids)
	}
	if _, err := os.Stat(ledger); err != nil {
		t.Errorf("the held set was reset: %v", err)
	}

	// A kubelet that does not answer changes nothing.
	k.err = errors.New("down")
	k.set()
	if err := kp.pass(context.Background()); err == nil {
		t.Error("pass with the kubelet down: no error")
	}
	if _, err := os.Stat(configOf(leadHeld.UID)); err != nil {
		t.Errorf("the held set went while the kubelet was down: %v", err)
	}
}

// TestKeeperThroughAKubeletRestart: while the kubelet restarts, its first pod-resources answers
// may come before it has restored its checkpoint and list no container; a held set must survive
// them. And a set whose container's process still runs is never removed, however many answers
// miss it.
func TestKeeperThroughAKubeletRestart(t *testing.T) {
	inv := testInventory(t, 2, 2)
	a, layout := newTestAllocator(t, inv, 0, cdi.InjectionNone)
	clock := &fakeClock{now: time.Unix(1000, 0)}
	a.now = clock.Now
	k := &fakeKubelet{}
	running := true
	kp := &keeper{alloc: a, holders: &holders{kubelet: k, resource: resource}, grace: 15 * time.Second, started: clock.Now(), logger: logr.Discard(),
		inUse: func(string) bool { return running }}
	lead := inv.byID[id(0, 1)]
	if _, err := a.allocate([]string{lead.ID}); err != nil {
		t.Fatal(err)
	}
	held := fakePod{"ns", "a", resource, ids([2]int{0, 1})}
	k.set(held)
	clock.add(time.Minute)
	exists := func() bool {
		uids, _ := layout.ListClaims()
		return slices.Contains(uids, lead.UID)
	}
	pass := func() {
		t.Helper()
		clock.add(5 * time.Second)
		if err := kp.pass(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	pass()
	// The kubelet restarts: two answers, 5 s apart, list nothing; then the container again.
	k.set()
	pass()
	pass()
	k.set(held)
	pass()
	k.set()
	pass()
	pass()
	if !exists() {
		t.Fatal("a held set was removed while the kubelet restarted")
	}
	// The kubelet has lost the container for good, but its process still runs.
	for range 5 {
		pass()
	}
	if !exists() {
		t.Fatal("a set whose container's process still runs was removed")
	}
	running = false
	pass()
	if exists() {
		t.Error("a set no container holds and no process uses survived")
	}
}
