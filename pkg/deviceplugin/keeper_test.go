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
// the start and since its last Allocate, and not before; a directory that is no share's stays.
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
	clock.add(6 * time.Second)
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
