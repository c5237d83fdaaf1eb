package nri

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"google.golang.org/protobuf/proto"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// switchOwnership is an Ownership the test flips.
type switchOwnership struct {
	mu    sync.Mutex
	owns  bool
	err   error
	calls int
}

func (o *switchOwnership) Enter(context.Context) (bool, func(), error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls++
	return o.owns, func() {}, o.err
}

func (o *switchOwnership) Owns() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.owns
}

func (o *switchOwnership) set(owns bool) {
	o.mu.Lock()
	o.owns = owns
	o.mu.Unlock()
}

// memDecisions are Decisions in memory, recording the order of calls.
type memDecisions struct {
	mu     sync.Mutex
	marked map[string]bool
	log    []string
}

func (d *memDecisions) Taken(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.log = append(d.log, "taken "+id)
	t := d.marked[id]
	delete(d.marked, id)
	return t
}
func (d *memDecisions) Record(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.log = append(d.log, "record "+id)
	d.marked[id] = true
}
func (d *memDecisions) Forget(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.marked, id)
}

// adjusted is the container as the runtime records it after a creation with adj applied.
func adjusted(ctr *api.Container, adj *api.ContainerAdjustment) *api.Container {
	c := proto.Clone(ctr).(*api.Container)
	for _, m := range adj.GetMounts() {
		c.Mounts = append(c.Mounts, m)
	}
	for _, kv := range adj.GetEnv() {
		c.Env = append(c.Env, kv.Key+"="+kv.Value)
	}
	c.State = api.ContainerState_CONTAINER_CREATED
	return c
}

// TestObserverDecidesNothingAndOwnRebuildsFromTheRuntime: an instance that does not own the node
// answers CreateContainer without an adjustment, creates and removes no directory, and keeps no
// cache; it follows what the runtime reports. When it becomes the owner, its cache is the node's
// at once — the containers the previous owner created are found by the registry's lookup.
func TestObserverDecidesNothingAndOwnRebuildsFromTheRuntime(t *testing.T) {
	c := testClaim(claimA, gpu0, gpu1)
	owner := newFixture(t, c)
	observer := newFixture(t)
	observer.layout = owner.layout // one node: one state dir
	observer.plugin = NewPlugin(Config{Layout: owner.layout, ProcRoot: owner.proc}, owner.claims, observer.metrics, owner.plugin.logger)
	own := &switchOwnership{}
	observer.plugin.SetOwnership(own, &memDecisions{marked: map[string]bool{}})
	p := pod(podA)

	if _, err := observer.plugin.Synchronize(context.Background(), []*api.PodSandbox{p}, nil); err != nil {
		t.Fatal(err)
	}
	ctr := vgpuContainer("c1", p, "app", c, true)
	if adj, err := observer.create(p, ctr); err != nil || adj != nil {
		t.Fatalf("observer's CreateContainer = %v, %v; want no adjustment", adj, err)
	}
	adj, err := owner.create(p, ctr)
	if err != nil || adj == nil {
		t.Fatalf("owner's CreateContainer = %v, %v", adj, err)
	}
	created := adjusted(ctr, adj)
	for _, pl := range []*Plugin{owner.plugin, observer.plugin} {
		if err := pl.PostCreateContainer(context.Background(), p, created); err != nil {
			t.Fatal(err)
		}
	}
	running := adjusted(ctr, adj)
	running.State, running.Pid = api.ContainerState_CONTAINER_RUNNING, 4242
	owner.fakePID(4242, "0::/kubepods/pod"+podA+"/c1\n")
	for _, pl := range []*Plugin{owner.plugin, observer.plugin} {
		if err := pl.StartContainer(context.Background(), p, running); err != nil {
			t.Fatal(err)
		}
	}
	if observer.plugin.Cache().Len() != 0 {
		t.Errorf("the observer cached %d containers; only the owner's cache is the node's", observer.plugin.Cache().Len())
	}
	// A container the owner removes while the observer is not the owner: the observer must
	// leave the directory (the owner may have given the name's directory to a new instance).
	d := owner.dirs(claimA, podA, "app")
	if err := observer.plugin.RemoveContainer(context.Background(), p, &api.Container{Id: "unknown", PodSandboxId: p.Id, Name: "app"}); err != nil {
		t.Fatal(err)
	}
	if !exists(d.Config) {
		t.Fatal("the observer removed a container directory")
	}

	own.set(true)
	if n := observer.plugin.Own(owner.claims); n != 1 {
		t.Fatalf("Own rebuilt %d containers, want the 1 the runtime reported", n)
	}
	in, ok := observer.plugin.Cache().Lookup(podA, "app")
	if !ok || in.ContainerID != "c1" || in.State != StateRunning || in.PID != 4242 || in.ConfigDir != d.Config {
		t.Fatalf("new owner's lookup = %+v, %v; want c1 running with PID 4242 in %s", in, ok, d.Config)
	}
	if !observer.plugin.Cache().Synced() {
		t.Error("the new owner's cache is not synced: the registry would answer RETRY")
	}
	// The new owner now enforces the invariant: another pod's container on the same result
	// fails.
	p2 := pod(podB)
	c2 := c
	c2.ReservedFor = []string{podA, podB}
	owner.claims.claims[claimA] = c2
	if _, err := observer.create(p2, vgpuContainer("c2", p2, "app", c, true)); err == nil || !strings.Contains(err.Error(), "already used") {
		t.Errorf("a second pod's container on the same results = %v, want the in-use refusal", err)
	}
}

// TestOwnerDecidesOnce: a container another instance decided (it was called first, and ownership
// moved before this call) gets no second adjustment; the owner marks what it decides before it
// answers, and a marked container is forgotten when removed.
func TestOwnerDecidesOnce(t *testing.T) {
	c := testClaim(claimA, gpu0)
	f := newFixture(t, c)
	dec := &memDecisions{marked: map[string]bool{"decided-elsewhere": true}}
	f.plugin.SetOwnership(&switchOwnership{owns: true}, dec)
	p := pod(podA)
	if adj, err := f.create(p, vgpuContainer("decided-elsewhere", p, "app", c, true)); err != nil || adj != nil {
		t.Fatalf("CreateContainer of a decided container = %v, %v; want no adjustment", adj, err)
	}
	if exists(f.dirs(claimA, podA, "app").Config) {
		t.Error("a directory was created for a container another instance decided")
	}
	adj, err := f.create(p, vgpuContainer("mine", p, "app", c, true))
	if err != nil || adj == nil {
		t.Fatalf("CreateContainer = %v, %v", adj, err)
	}
	if want := []string{"taken decided-elsewhere", "taken mine", "record mine"}; !slices.Equal(dec.log, want) {
		t.Errorf("decision calls %v, want %v", dec.log, want)
	}
	if err := f.plugin.RemoveContainer(context.Background(), p, &api.Container{Id: "mine", PodSandboxId: p.Id, Name: "app"}); err != nil {
		t.Fatal(err)
	}
	if dec.marked["mine"] {
		t.Error("a removed container's mark was kept")
	}
}

// TestOwnerLearnsItsPredecessorsLastContainers: a container the previous owner adjusted just
// before the node changed hands reaches the new owner's cache through PostCreateContainer.
func TestOwnerLearnsItsPredecessorsLastContainers(t *testing.T) {
	c := testClaim(claimA, gpu0)
	old := newFixture(t, c)
	p, created := createdByOld(t, old, c, "late")
	succ := successorOf(t, old)
	succ.SetOwnership(&switchOwnership{owns: true}, noDecisions{})
	succ.Own(old.claims)
	if err := succ.PostCreateContainer(context.Background(), p, created); err != nil {
		t.Fatal(err)
	}
	if in, ok := succ.Cache().Lookup(podA, "app"); !ok || in.ContainerID != "late" {
		t.Errorf("the new owner did not learn the container: %+v %v", in, ok)
	}
	// A container without our adjustment (a rejected one, a forged claim UID) is not learned.
	forged := vgpuContainer("forged", p, "other", c, true)
	if err := succ.PostCreateContainer(context.Background(), p, forged); err != nil {
		t.Fatal(err)
	}
	if _, ok := succ.Cache().Get("forged"); ok {
		t.Error("a container without our mounts and identity was learned")
	}
}

// TestCreateContainerFailsWhenOwnershipIsUndecided: a call held past its deadline fails the
// container (the kubelet retries); it is never created without a decision.
func TestCreateContainerFailsWhenOwnershipIsUndecided(t *testing.T) {
	c := testClaim(claimA, gpu0)
	f := newFixture(t, c)
	undecided := errors.New("handing over")
	f.plugin.SetOwnership(&switchOwnership{owns: true, err: undecided}, noDecisions{})
	p := pod(podA)
	if _, err := f.create(p, vgpuContainer("c", p, "app", c, true)); !errors.Is(err, undecided) {
		t.Errorf("CreateContainer = %v, want the ownership's error", err)
	}
	if got := f.counter("vgpu_dra_nri_errors_total", "hook", "create_container"); got != 1 {
		t.Errorf("nri_errors_total{hook=create_container} = %v, want 1", got)
	}
	// A container without a claim is never held.
	if adj, err := f.create(p, &api.Container{Id: "plain", Name: "x", Env: []string{contract.EnvClaimUID + "="}}); err != nil || adj != nil {
		t.Errorf("plain container: %v %v", adj, err)
	}
}

// TestOwnBeforeTheFirstSynchronize: an instance that takes the node before the runtime has
// synchronized with it (the old pod exited as the new one started) knows no container yet. Its
// cache must stay unsynchronized — the registry answers RETRY, not NOT_FOUND for a container the
// node runs — and the runtime's first Synchronize must build it, even when it arrives before the
// rest of the plugin says this instance owns the node.
func TestOwnBeforeTheFirstSynchronize(t *testing.T) {
	c := testClaim(claimA, gpu0)
	old := newFixture(t, c)
	p, running := createdByOld(t, old, c, "c1")
	running.State, running.Pid = api.ContainerState_CONTAINER_RUNNING, 4242
	old.fakePID(4242, "0::/kubepods/pod"+podA+"/c1\n")

	succ := successorOf(t, old)
	own := &switchOwnership{} // the plugin's gates still say observer
	succ.SetOwnership(own, &memDecisions{marked: map[string]bool{}})
	if n := succ.Own(old.claims); n != 0 {
		t.Fatalf("Own before any Synchronize rebuilt %d containers from an empty view", n)
	}
	if succ.Cache().Synced() {
		t.Fatal("the cache is synced before the runtime synchronized: the registry would answer NOT_FOUND for running containers")
	}
	if _, err := succ.Synchronize(context.Background(), []*api.PodSandbox{p}, []*api.Container{running}); err != nil {
		t.Fatal(err)
	}
	if !succ.Cache().Synced() {
		t.Fatal("the first Synchronize after Own left the cache unsynced")
	}
	if in, ok := succ.Cache().Lookup(podA, "app"); !ok || in.ContainerID != "c1" || in.PID != 4242 {
		t.Fatalf("lookup after the first Synchronize = %+v, %v; want c1 with PID 4242", in, ok)
	}
	// Only that first Synchronize: a later one while the plugin says observer (the instance
	// handed the node on) leaves the cache alone.
	if _, err := succ.Synchronize(context.Background(), []*api.PodSandbox{p}, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := succ.Cache().Lookup(podA, "app"); !ok {
		t.Error("an observer's Synchronize rebuilt the cache")
	}
}

// createdByOld has the fixture's instance (the old owner) adjust a vGPU container of podA named
// "app" with id, and returns the pod and the container as the runtime records it after creation.
func createdByOld(t *testing.T, old *fixture, c Claim, id string) (*api.PodSandbox, *api.Container) {
	t.Helper()
	p := pod(podA)
	ctr := vgpuContainer(id, p, "app", c, true)
	adj, err := old.create(p, ctr)
	if err != nil || adj == nil {
		t.Fatalf("CreateContainer = %v, %v", adj, err)
	}
	return p, adjusted(ctr, adj)
}

// successorOf is a second instance on old's node, as a new plugin process starts it.
func successorOf(t *testing.T, old *fixture) *Plugin {
	return NewPlugin(Config{Layout: old.layout, ProcRoot: old.proc}, old.claims, newFixture(t).metrics, old.plugin.logger)
}

// TestStartBetweenOwnAndTheOwnershipFlip: the plugin rebuilds the cache (Own) a moment before
// its gates say it owns the node. A container that the runtime starts in that moment is in the
// rebuilt cache but not in the view Own read: its PID must still reach the cache, or every
// registration of that container gets RETRY ("created but not started yet") until the next
// Synchronize (the e2e upgrade test met it at a rollback).
func TestStartBetweenOwnAndTheOwnershipFlip(t *testing.T) {
	c := testClaim(claimA, gpu0, gpu1)
	old := newFixture(t, c)
	succ := successorOf(t, old)
	own := &switchOwnership{}
	succ.SetOwnership(own, &memDecisions{marked: map[string]bool{}})
	p, created := createdByOld(t, old, c, "c1")
	if _, err := succ.Synchronize(context.Background(), []*api.PodSandbox{p}, nil); err != nil {
		t.Fatal(err)
	}
	if err := succ.PostCreateContainer(context.Background(), p, created); err != nil {
		t.Fatal(err)
	}
	if n := succ.Own(old.claims); n != 1 {
		t.Fatalf("Own rebuilt %d containers, want 1", n)
	}
	running := proto.Clone(created).(*api.Container) // its own message, as the runtime sends it
	running.State, running.Pid = api.ContainerState_CONTAINER_RUNNING, 4242
	old.fakePID(4242, "0::/kubepods/pod"+podA+"/c1\n")
	if err := succ.StartContainer(context.Background(), p, running); err != nil { // gates not flipped yet
		t.Fatal(err)
	}
	own.set(true)
	in, ok := succ.Cache().Lookup(podA, "app")
	if !ok || in.State != StateRunning || in.PID != 4242 {
		t.Fatalf("the new owner's lookup = %+v, %v; want c1 running with PID 4242", in, ok)
	}
}

// TestStartBeforeTheSuccessorsSynchronize: a successor connects to NRI while a container of the
// old owner is starting. The runtime runs the StartContainer hook before the successor's
// Synchronize, whose snapshot still has the container created, without a PID; the successor
// learns the PID from PostStartContainer, before and after it owns the node (the e2e upgrade
// test met it at a rollback: a churned pod's registrations got RETRY for its whole budget).
func TestStartBeforeTheSuccessorsSynchronize(t *testing.T) {
	for _, ownFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "post-start-then-own", true: "own-then-post-start"}[ownFirst], func(t *testing.T) {
			c := testClaim(claimA, gpu0, gpu1)
			old := newFixture(t, c)
			succ := successorOf(t, old)
			own := &switchOwnership{}
			succ.SetOwnership(own, &memDecisions{marked: map[string]bool{}})
			p, created := createdByOld(t, old, c, "c1")
			if _, err := succ.Synchronize(context.Background(), []*api.PodSandbox{p}, []*api.Container{created}); err != nil {
				t.Fatal(err)
			}
			// A copy: the runtime hands each hook its own message; the snapshot keeps PID 0.
			running := proto.Clone(created).(*api.Container)
			running.State, running.Pid = api.ContainerState_CONTAINER_RUNNING, 4242
			old.fakePID(4242, "0::/kubepods/pod"+podA+"/c1\n")
			postStart := func() {
				if err := succ.PostStartContainer(context.Background(), p, running); err != nil {
					t.Fatal(err)
				}
			}
			if !ownFirst {
				postStart()
			}
			if n := succ.Own(old.claims); n != 1 {
				t.Fatalf("Own rebuilt %d containers, want 1", n)
			}
			own.set(true)
			if ownFirst {
				postStart()
			}
			in, ok := succ.Cache().Lookup(podA, "app")
			if !ok || in.State != StateRunning || in.PID != 4242 {
				t.Fatalf("the new owner's lookup = %+v, %v; want c1 running with PID 4242 (the registry finds its cgroup from it)", in, ok)
			}
		})
	}
}
