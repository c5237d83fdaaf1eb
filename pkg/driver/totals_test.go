package driver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
)

// walkGPUStates is what GPUStates must say, summed the long way: over every claim of a
// snapshot of the checkpoint.
func walkGPUStates(d *Driver) []usage.GPU {
	out := make([]usage.GPU, len(d.devices))
	for i, g := range d.devices {
		_, bad := d.health.unhealthy(g.UUID)
		out[i] = usage.GPU{UUID: g.UUID, Device: DeviceName(g.Index), PublishedMemory: publishedMemory(g, d.cfg.MemoryReserve), Healthy: !bad}
	}
	for _, c := range d.deps.Checkpoint.Snapshot().Claims {
		for _, dev := range c.Devices {
			for i := range out {
				if out[i].UUID != dev.GPUUUID || dev.AdminAccess {
					continue
				}
				mem, cores := dev.MemoryBytes, dev.Cores
				if mem == 0 {
					mem = out[i].PublishedMemory
				}
				if cores == 0 {
					cores = coresTotal
				}
				out[i].AllocatedMemory += mem
				out[i].AllocatedCores += cores
				out[i].Shares++
			}
		}
	}
	return out
}

// heldRecords are the checkpoint's records as a reader holds them (Range: no copy, the
// store's own memory) with a deep copy of each, taken at the same moment.
func heldRecords(store *checkpoint.Store) (shared, copied map[string]checkpoint.Claim) {
	shared, copied = map[string]checkpoint.Claim{}, map[string]checkpoint.Claim{}
	store.Range(func(uid string, c *checkpoint.Claim) {
		shared[uid] = *c
		copied[uid] = c.DeepCopy()
	})
	return shared, copied
}

// restarted is the plugin after a restart: the checkpoint opened again from its file, a new
// driver over the same directories, start-up recovery run.
func restarted(t *testing.T, d *testDriver, bootID string) *testDriver {
	t.Helper()
	if err := d.deps.Checkpoint.Close(); err != nil {
		t.Fatal(err)
	}
	store, err := checkpoint.Open(d.deps.Checkpoint.Path())
	if err != nil {
		t.Fatal(err)
	}
	deps, cfg := d.deps, d.cfg
	deps.Checkpoint, deps.DRAMetrics, cfg.BootID = store, d.dra, bootID
	nd, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := nd.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	return &testDriver{Driver: nd, reg: d.reg}
}

// TestEveryPathKeepsTotalsExactAndRecordsUnchanged runs a long random sequence of what changes
// the checkpoint — Prepare (one claim or several in one call, whole GPUs, shares, admin access,
// refused as overcommitted), a repeated Prepare for another pod, Unprepare, the reconciliation
// (unpreparing deleted claims, keeping those whose containers still run), a restart (with a
// reboot, with a claim an earlier version left half-prepared) and the background directory
// removals — and checks after each step that:
//   - the running totals the capacity check and the usage metrics read equal a walk over every
//     prepared claim, and no GPU is allocated past its capacity;
//   - no record a reader held before the step was modified in place (the checkpoint shares
//     records between its states: copy-on-write).
func TestEveryPathKeepsTotalsExactAndRecordsUnchanged(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	api := newFakeClaimAPI()
	users := &fakeUsers{running: map[string][]ClaimUser{}}
	d := newTestDriver(t, func(_ *Config, deps *Deps) { deps.Claims, deps.Users = api, users })
	const nClaims = 16
	uidOf := func(i int) string { return fmt.Sprintf("c1a10000-0000-4000-8000-%012d", i) }
	claimOf := func(i int) *resourceapi.ResourceClaim {
		var results []resourceapi.DeviceRequestAllocationResult
		for r := range 1 + rng.IntN(2) {
			gpu := fmt.Sprintf("gpu-%d", rng.IntN(2))
			var res resourceapi.DeviceRequestAllocationResult
			switch rng.IntN(6) {
			case 0:
				res = result("gpu", gpu, "", "") // the whole GPU
			case 1:
				res = admin(result("gpu", gpu, "", ""))
			default:
				res = result("gpu", gpu, fmt.Sprintf("%dGi", 1+rng.IntN(30)), fmt.Sprint(1+rng.IntN(60)))
			}
			res.Request = fmt.Sprintf("gpu%d", r)
			res.ShareID = ptr.To(types.UID(fmt.Sprintf("5f1c2d3e-4a5b-4c6d-8e7f-%06d%06d", i, r)))
			results = append(results, res)
		}
		return apiClaim(fmt.Sprintf("claim-%d", i), uidOf(i), results...)
	}
	apiView := map[string]*resourceapi.ResourceClaim{} // what the kubelet last prepared, by UID
	seen := map[string]int{}
	for step := range 1500 {
		shared, copied := heldRecords(d.deps.Checkpoint)
		i := rng.IntN(nClaims)
		uid := uidOf(i)
		op := rng.IntN(10)
		switch op {
		case 0, 1, 2: // Prepare, alone or with others in one call
			var batch []*resourceapi.ResourceClaim
			inBatch := map[int]bool{}
			for range 1 + rng.IntN(4) {
				j := rng.IntN(nClaims)
				if inBatch[j] {
					continue
				}
				inBatch[j] = true
				c, ok := apiView[uidOf(j)]
				if !ok || rng.IntN(3) == 0 {
					c = claimOf(j)
				}
				batch = append(batch, c)
			}
			errs := prepare(t, d, batch...)
			for _, c := range batch {
				if errs[c.UID] == nil {
					apiView[string(c.UID)] = c
					api.mu.Lock()
					api.claims[c.Namespace+"/"+c.Name] = c
					api.mu.Unlock()
				}
			}
		case 3: // prepared again for a second pod
			if c, ok := apiView[uid]; ok {
				c = c.DeepCopy()
				c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "second", UID: types.UID(fmt.Sprintf("90d00000-0000-4000-8000-%012d", step))})
				_ = prepare(t, d, c)
			}
		case 4, 5: // Unprepare
			c := claimOf(i)
			if _, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}}); err != nil {
				t.Fatal(err)
			}
			delete(apiView, uid)
		case 6: // the API server loses the claim; its container may still run (the in-use rule)
			if c, ok := apiView[uid]; ok {
				api.mu.Lock()
				delete(api.claims, c.Namespace+"/"+c.Name)
				api.mu.Unlock()
				if rng.IntN(2) == 0 {
					users.running[uid] = []ClaimUser{{Namespace: "team", Pod: "p", Container: "app"}}
				} else {
					delete(users.running, uid)
				}
			}
			if _, err := d.Reconcile(context.Background()); err != nil {
				t.Fatal(err)
			}
			for u := range apiView {
				if _, ok := d.deps.Checkpoint.Get(u); !ok {
					delete(apiView, u)
				}
			}
		case 7: // the containers of kept claims stop; the next pass unprepares them
			clear(users.running)
			if _, err := d.Reconcile(context.Background()); err != nil {
				t.Fatal(err)
			}
			for u := range apiView {
				if _, ok := d.deps.Checkpoint.Get(u); !ok {
					delete(apiView, u)
				}
			}
		case 8: // restart, sometimes after a reboot, sometimes with a claim an older version left half-prepared
			if rng.IntN(3) == 0 {
				c := claimOf(i)
				if _, ok := d.deps.Checkpoint.Get(uid); !ok {
					devs, err := d.devicesOf(c)
					if err != nil {
						t.Fatal(err)
					}
					if err := d.deps.Checkpoint.Put(uid, checkpoint.Claim{Namespace: c.Namespace, Name: c.Name, State: checkpoint.PrepareStarted, Devices: devs}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := d.WaitRemovals(t.Context()); err != nil {
				t.Fatal(err)
			}
			d = restarted(t, d, fmt.Sprintf("boot-%d", rng.IntN(2)))
			for u := range apiView {
				if _, ok := d.deps.Checkpoint.Get(u); !ok {
					delete(apiView, u)
				}
			}
		case 9: // the background removals of unprepared claims' directories
			if err := d.WaitRemovals(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		seen[fmt.Sprint(op)]++

		if !reflect.DeepEqual(shared, copied) {
			t.Fatalf("step %d (op %d): a record held before the step was modified in place:\n%+v\nwant\n%+v", step, op, shared, copied)
		}
		want := walkGPUStates(d.Driver)
		if got := d.GPUStates(); !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d (op %d): GPUStates from the running totals\n%+v\na walk over every claim\n%+v", step, op, got, want)
		}
		for _, g := range want {
			if g.AllocatedMemory > g.PublishedMemory || g.AllocatedCores > coresTotal {
				t.Fatalf("step %d (op %d): %s allocated past its capacity: %+v", step, op, g.Device, g)
			}
			d.admitted.mu.Lock()
			mem, cores := takenOf(d.admitted.takenBesides(d.deps.Checkpoint.Totals(), "")(g.UUID), g.PublishedMemory)
			d.admitted.mu.Unlock()
			if mem != g.AllocatedMemory || cores != g.AllocatedCores {
				t.Fatalf("step %d (op %d): the capacity check counts %d bytes and %d%% cores on %s, a walk %d and %d%%", step, op, mem, cores, g.Device, g.AllocatedMemory, g.AllocatedCores)
			}
		}
	}
	if len(seen) != 10 {
		t.Errorf("only operations %v ran", seen)
	}
}
