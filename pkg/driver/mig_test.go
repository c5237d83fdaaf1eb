package driver

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// migSim is a simulated DGX H200 of two GPUs, GPU 0 MIG-managed, its MIG state in a file so
// that a second driver over the same file sees the instances the first made.
type migSim struct {
	sim     *gpu.Simulated
	devices []gpu.Device
	layouts map[string]gpu.MIGLayout
}

func newMIGSim(t testing.TB, stateFile string) migSim {
	t.Helper()
	sim, err := gpu.NewSimulated("dgx-h200", 2, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	if stateFile != "" {
		if err := sim.SetMIGStateFile(stateFile); err != nil {
			t.Fatal(err)
		}
	}
	devs, err := sim.Devices(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	l, err := sim.MIGLayout(devs[0].UUID)
	if err != nil {
		t.Fatal(err)
	}
	return migSim{sim: sim, devices: devs, layouts: map[string]gpu.MIGLayout{devs[0].UUID: l}}
}

func (m migSim) driver(t testing.TB, mutate ...func(*Config, *Deps)) *testDriver {
	t.Helper()
	return newTestDriver(t, append([]func(*Config, *Deps){func(_ *Config, deps *Deps) {
		deps.Devices, deps.MIGLayouts, deps.MIG = m.devices, m.layouts, m.sim
	}}, mutate...)...)
}

// TestMIGPublishing: a MIG-managed GPU publishes its partitions beside its whole-GPU device, all
// of them charged to the GPU's counter set, and the rest of the node is published as before.
func TestMIGPublishing(t *testing.T) {
	m := newMIGSim(t, "")
	d := m.driver(t)
	res := d.buildResources(klog.Background())
	pool := res.Pools["node-1"]
	var sets []resourceapi.CounterSet
	devs := map[string]resourceapi.Device{}
	for i, s := range pool.Slices {
		if len(s.SharedCounters) > 0 && len(s.Devices) > 0 {
			t.Errorf("slice %d has counters and devices; the API takes one or the other", i)
		}
		if len(s.Devices) > maxDevicesWithCounters {
			t.Errorf("slice %d has %d devices, over the API's %d for devices with counters", i, len(s.Devices), maxDevicesWithCounters)
		}
		sets = append(sets, s.SharedCounters...)
		for _, dev := range s.Devices {
			devs[dev.Name] = dev
		}
	}
	if len(sets) != 1 || sets[0].Name != "gpu-0-counters" {
		t.Fatalf("counter sets %+v, want one, gpu-0-counters", sets)
	}
	for _, c := range []string{"slot-0", "slot-6", "compute-slices", "memory"} {
		if _, ok := sets[0].Counters[c]; !ok {
			t.Errorf("counter %s missing from %v", c, sets[0].Counters)
		}
	}
	if got := sets[0].Counters["compute-slices"].Value; got.Value() != 7 {
		t.Errorf("compute slices %s, want 7", got.String())
	}
	whole := devs["gpu-0"]
	if len(whole.ConsumesCounters) != 1 || len(whole.ConsumesCounters[0].Counters) != 9 {
		t.Errorf("gpu-0 consumes %+v, want all 7 slots, the compute slices and the memory", whole.ConsumesCounters)
	}
	if other := devs["gpu-1"]; other.Name == "" || len(other.ConsumesCounters) != 0 {
		t.Errorf("gpu-1 (not MIG-managed) = %+v, want it without counters", other)
	}
	two, ok := devs["gpu-0-mig-2g-35gb-2"]
	if !ok {
		t.Fatalf("no 2g.35gb at slot 2 among %d devices", len(devs))
	}
	c := two.ConsumesCounters[0].Counters
	if len(c) != 4 || counterValue(c["slot-2"]) != 1 || counterValue(c["slot-3"]) != 1 || counterValue(c["compute-slices"]) != 2 {
		t.Errorf("2g.35gb at slot 2 consumes %v, want slots 2 and 3, 2 compute slices and its memory", c)
	}
	if two.Attributes["type"].StringValue == nil || *two.Attributes["type"].StringValue != "mig" ||
		*two.Attributes["migProfile"].StringValue != "2g.35gb" || *two.Attributes["parentUUID"].StringValue != m.devices[0].UUID {
		t.Errorf("2g.35gb attributes %v", two.Attributes)
	}
	if _, ok := two.Attributes["uuid"]; ok {
		t.Error("a partition carries the GPU's uuid attribute: a selector on a GPU's UUID would match its partitions")
	}
	if mem := two.Capacity[contract.CapacityMemory].Value; mem.Value() != 35840<<20 || !ptr.Deref(two.AllowMultipleAllocations, false) {
		t.Errorf("2g.35gb memory %s, shareable %v; want 35 GiB, shareable", mem.String(), two.AllowMultipleAllocations)
	}
	// A profile that cannot fill its placements at once has a count of its own.
	if me := devs["gpu-0-mig-1g-18gb-me-3"].ConsumesCounters[0].Counters; counterValue(me[instancesCounter(7)]) != 1 {
		t.Errorf("1g.18gb+me consumes %v, want its instance count too", me)
	}
}

// TestMIGScheduling runs the scheduler's own allocator (k8s.io/dynamic-resource-allocation) over
// the published slices: a 1g and a 3g partition fit on one GPU, and once a partition is taken no
// share of the whole GPU fits, and the other way round; shares of the whole GPU still fit
// beside each other.
func TestMIGScheduling(t *testing.T) {
	m := newMIGSim(t, "")
	d := m.driver(t)
	s := newAllocSim(t, d.buildResources(klog.Background()))
	partition := func(name, profile string) *resourceapi.ResourceClaim {
		return s.claim(name, fmt.Sprintf(`device.attributes["vgpu.dra.dev"].type == "mig" && device.attributes["vgpu.dra.dev"].migProfile == %q`, profile), nil)
	}
	share := func(name string) *resourceapi.ResourceClaim {
		return s.claim(name, `device.attributes["vgpu.dra.dev"].type == "vgpu" && device.attributes["vgpu.dra.dev"].index == 0`,
			map[resourceapi.QualifiedName]resource.Quantity{contract.CapacityMemory: resource.MustParse("10Gi"), contract.CapacityCores: resource.MustParse("30")})
	}
	if got := s.allocate(t, partition("small", "1g.18gb")); !strings.HasPrefix(got, "gpu-0-mig-1g-18gb-") {
		t.Fatalf("1g.18gb got %q", got)
	}
	if got := s.allocate(t, partition("big", "3g.71gb")); !strings.HasPrefix(got, "gpu-0-mig-3g-71gb-") {
		t.Fatalf("3g.71gb beside it got %q", got)
	}
	if got := s.allocate(t, share("share")); got != "" {
		t.Fatalf("a share of GPU 0 was placed beside its partitions, on %s", got)
	}
	if got := s.allocate(t, partition("full", "7g.141gb")); got != "" {
		t.Fatalf("a 7g.141gb was placed on a GPU with two partitions, on %s", got)
	}

	s = newAllocSim(t, d.buildResources(klog.Background()))
	for i := range 3 {
		if got := s.allocate(t, share(fmt.Sprintf("share-%d", i))); got != "gpu-0" {
			t.Fatalf("share %d of GPU 0 got %q", i, got)
		}
	}
	if got := s.allocate(t, partition("small", "1g.18gb")); got != "" {
		t.Fatalf("a partition was placed on a GPU with shares, on %s", got)
	}
}

// allocSim allocates claims one after another with the scheduler's allocator, keeping what is
// allocated as the scheduler does.
type allocSim struct {
	slices []*resourceapi.ResourceSlice
	state  structured.AllocatedState
	node   *v1.Node
}

func newAllocSim(t *testing.T, res resourceslice.DriverResources) *allocSim {
	t.Helper()
	s := &allocSim{
		node: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}},
		state: structured.AllocatedState{
			AllocatedDevices: sets.New[structured.DeviceID](), AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity: structured.NewConsumedCapacityCollection(),
		},
	}
	for name, pool := range res.Pools {
		for i, sl := range pool.Slices {
			s.slices = append(s.slices, &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver: contract.DefaultDriverName, NodeName: ptr.To("node-1"),
					Pool:    resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
					Devices: sl.Devices, SharedCounters: sl.SharedCounters,
				},
			})
		}
	}
	return s
}

func (s *allocSim) claim(name, selector string, capacity map[resourceapi.QualifiedName]resource.Quantity) *resourceapi.ResourceClaim {
	req := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: contract.DefaultDriverName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}},
	}}
	if capacity != nil {
		req.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: capacity}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID(name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}},
	}
}

// allocate allocates one claim and records it; "" when it does not fit.
func (s *allocSim) allocate(t *testing.T, claim *resourceapi.ResourceClaim) string {
	t.Helper()
	features := structured.Features{ConsumableCapacity: true, PartitionableDevices: true}
	alloc, err := structured.NewAllocator(t.Context(), features, s.state, classes{},
		s.slices, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		t.Fatal(err)
	}
	out, err := alloc.Allocate(t.Context(), s.node, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatalf("allocate %s: %v", claim.Name, err)
	}
	if len(out) == 0 {
		return ""
	}
	r := out[0].Devices.Results[0]
	id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
	if r.ShareID != nil {
		s.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		s.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
	} else {
		s.state.AllocatedDevices.Insert(id)
	}
	return r.Device
}

// classes has the one DeviceClass the chart creates, which selects every device of the driver.
type classes struct{}

func (classes) List() ([]*resourceapi.DeviceClass, error) {
	c, _ := classes{}.Get(contract.DefaultDriverName)
	return []*resourceapi.DeviceClass{c}, nil
}

func (classes) Get(name string) (*resourceapi.DeviceClass, error) {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", contract.DefaultDriverName)}}}},
	}, nil
}

// TestMIGPrepareAndUnprepare: a claim on a partition gets a MIG instance made at its placement,
// recorded with its MIG UUID, which its CDI spec names; a second claim sharing the partition uses
// the same instance, which goes with the last of them; a whole-GPU share then takes the GPU out
// of MIG mode; and what cannot be made is a clear Prepare error naming the claim and the GPU.
func TestMIGPrepareAndUnprepare(t *testing.T) {
	m := newMIGSim(t, "")
	d := m.driver(t)
	gpu0 := m.devices[0].UUID
	a := apiClaim("a", "a0000000-0000-4000-8000-000000000001", result("gpu", "gpu-0-mig-2g-35gb-2", "4Gi", "50"))
	b := apiClaim("b", "b0000000-0000-4000-8000-000000000002", result("gpu", "gpu-0-mig-2g-35gb-2", "4Gi", "50"))
	for uid, err := range prepare(t, d, a, b) {
		if err != nil {
			t.Fatalf("prepare %s: %v", uid, err)
		}
	}
	list, err := m.sim.MIGInstances(gpu0)
	if err != nil || len(list) != 1 || list[0].Placement != (gpu.MIGPlacement{Start: 2, Size: 2}) {
		t.Fatalf("instances %+v, %v; want one 2g at slot 2 for both claims", list, err)
	}
	rec, _ := d.deps.Checkpoint.Get(string(a.UID))
	if rec.Devices[0].MIG.UUID != list[0].UUID || rec.Devices[0].MIG.GPUInstanceID != list[0].GPUInstanceID {
		t.Errorf("record %+v, want the instance %+v", rec.Devices[0].MIG, list[0])
	}
	data := preparedData(t, d, a)
	if data.MIGProfile != "2g.35gb" || data.MIGUUID != list[0].UUID || data.Memory != "4Gi" {
		t.Errorf("device status data %+v, want the profile, the MIG device and the share's memory", data)
	}
	spec, err := os.ReadFile(d.deps.CDI.SpecPath(string(a.UID)))
	if err != nil || !strings.Contains(string(spec), list[0].UUID) || strings.Contains(string(spec), gpu0) {
		t.Errorf("CDI spec (%v) does not name the MIG device %s alone:\n%s", err, list[0].UUID, spec)
	}
	unprepareAll(t, d, a)
	if list, _ := m.sim.MIGInstances(gpu0); len(list) != 1 {
		t.Fatalf("the instance went with the first of its two claims: %+v", list)
	}
	unprepareAll(t, d, b)
	if list, _ := m.sim.MIGInstances(gpu0); len(list) != 0 {
		t.Fatalf("the instance stayed after its last claim: %+v", list)
	}
	if on, _, _ := m.sim.MIGMode(gpu0); !on {
		t.Fatal("MIG mode went off with the last partition; it changes only when a claim needs it")
	}
	whole := apiClaim("w", "c0000000-0000-4000-8000-000000000003", result("gpu", "gpu-0", "4Gi", "50"))
	if err := prepare(t, d, whole)[whole.UID]; err != nil {
		t.Fatal(err)
	}
	if on, _, _ := m.sim.MIGMode(gpu0); on {
		t.Error("a whole-GPU share was prepared on a GPU left in MIG mode")
	}
	// Behind the scheduler's back (a stale slice): a partition beside the share is refused.
	late := apiClaim("late", "d0000000-0000-4000-8000-000000000004", result("gpu", "gpu-0-mig-1g-18gb-0", "", ""))
	err = prepare(t, d, late)[late.UID]
	if err == nil || !strings.Contains(err.Error(), "team/late") || !strings.Contains(err.Error(), "shared whole") {
		t.Errorf("a partition beside a whole-GPU share: %v", err)
	}
	unprepareAll(t, d, whole)
	// A placement someone else took (an operator's nvidia-smi) is a clear error.
	if err := m.sim.SetMIGMode(gpu0, true); err != nil {
		t.Fatal(err)
	}
	if _, err := m.sim.CreateMIGInstance(gpu0, nvml.GPU_INSTANCE_PROFILE_2_SLICE, gpu.MIGPlacement{Start: 0, Size: 2}); err != nil {
		t.Fatal(err)
	}
	err = prepare(t, d, late)[late.UID]
	if err == nil || !strings.Contains(err.Error(), "team/late") || !strings.Contains(err.Error(), gpu0) || !strings.Contains(err.Error(), "taken") {
		t.Errorf("a partition whose placement is taken: %v", err)
	}
	if got := d.metric(t, "vgpu_dra_prepare_errors_total", "reason", "mig"); got != 1 {
		t.Errorf("prepare errors with reason mig: %v, want 1", got)
	}
}

// TestMIGStartUp: a plugin that starts where a crashed one left the GPU destroys the instance no
// record names (a kill between making it and the record) and keeps the recorded one; after a
// reboot (no instances at all) it makes the recorded partition again, and its record and CDI
// spec name the new MIG device.
func TestMIGStartUp(t *testing.T) {
	state := filepath.Join(t.TempDir(), "mig.json")
	m := newMIGSim(t, state)
	var ckpt string
	d := m.driver(t, func(_ *Config, deps *Deps) { ckpt = deps.Checkpoint.Path() })
	gpu0 := m.devices[0].UUID
	a := apiClaim("a", "a0000000-0000-4000-8000-000000000001", result("gpu", "gpu-0-mig-3g-71gb-4", "", ""))
	if err := prepare(t, d, a)[a.UID]; err != nil {
		t.Fatal(err)
	}
	recorded, _ := d.deps.Checkpoint.Get(string(a.UID))
	orphan, err := m.sim.CreateMIGInstance(gpu0, 0, gpu.MIGPlacement{Start: 0, Size: 1})
	if err != nil {
		t.Fatal(err)
	}

	restarted := newMIGSim(t, state)
	d2 := restarted.driver(t, func(_ *Config, deps *Deps) { deps.Checkpoint = reopen(t, ckpt) })
	list, _ := restarted.sim.MIGInstances(gpu0)
	if len(list) != 1 || list[0].UUID != recorded.Devices[0].MIG.UUID {
		t.Fatalf("after a restart: instances %+v; want the recorded one (%s) kept and the orphan (%s) destroyed", list, recorded.Devices[0].MIG.UUID, orphan.UUID)
	}
	_ = d2

	rebooted := newMIGSim(t, filepath.Join(t.TempDir(), "fresh.json"))
	d3 := rebooted.driver(t, func(_ *Config, deps *Deps) { deps.Checkpoint = reopen(t, ckpt) })
	list, _ = rebooted.sim.MIGInstances(gpu0)
	if len(list) != 1 || list[0].Placement.Start != 4 {
		t.Fatalf("after a reboot: instances %+v; want the 3g at slot 4 made again", list)
	}
	now, _ := d3.deps.Checkpoint.Get(string(a.UID))
	spec, _ := os.ReadFile(d3.deps.CDI.SpecPath(string(a.UID)))
	if now.Devices[0].MIG.UUID != list[0].UUID || !strings.Contains(string(spec), list[0].UUID) {
		t.Errorf("after a reboot the record names %s and the spec %q; want the new instance %s", now.Devices[0].MIG.UUID, spec, list[0].UUID)
	}
}

func reopen(t *testing.T, path string) *checkpoint.Store {
	t.Helper()
	s, err := checkpoint.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func unprepareAll(t *testing.T, d *testDriver, claims ...*resourceapi.ResourceClaim) {
	t.Helper()
	var objs []kubeletplugin.NamespacedObject
	for _, c := range claims {
		objs = append(objs, kubeletplugin.NamespacedObject{UID: c.UID})
	}
	res, err := d.UnprepareResourceClaims(t.Context(), objs)
	if err != nil {
		t.Fatal(err)
	}
	for uid, err := range res {
		if err != nil {
			t.Fatalf("unprepare %s: %v", uid, err)
		}
	}
}

func counterValue(c resourceapi.Counter) int64 { return c.Value.Value() }

// TestMIGHealth: a partition is as healthy as its GPU, in the kubelet's health report and in
// the slice's taints.
func TestMIGHealth(t *testing.T) {
	m := newMIGSim(t, "")
	d := m.driver(t)
	d.health.set(gpu.HealthEvent{UUID: m.devices[0].UUID, Healthy: false, Reason: "XID 79"}, time.Now())
	report := map[string]kubeletplugin.DeviceHealth{}
	for _, dh := range d.healthReport(nil).Devices {
		report[dh.DeviceName] = dh
	}
	if dh, ok := report["gpu-0-mig-1g-18gb-0"]; !ok || dh.Health != kubeletplugin.HealthStatusUnhealthy {
		t.Errorf("partition of an unhealthy GPU reported %+v (present %v), want unhealthy", dh, ok)
	}
	if dh := report["gpu-1"]; dh.Health != kubeletplugin.HealthStatusHealthy {
		t.Errorf("gpu-1 reported %+v", dh)
	}
	for _, s := range d.buildResources(klog.Background()).Pools["node-1"].Slices {
		for _, dev := range s.Devices {
			if strings.HasPrefix(dev.Name, "gpu-0-mig-") && len(dev.Taints) != 1 {
				t.Errorf("partition %s of an unhealthy GPU has taints %+v", dev.Name, dev.Taints)
			}
		}
	}
}

// preparedData is the device status data Prepare gives the claim's first result.
func preparedData(t *testing.T, d *testDriver, c *resourceapi.ResourceClaim) contract.DeviceStatusData {
	t.Helper()
	rec, ok := d.deps.Checkpoint.Get(string(c.UID))
	if !ok {
		t.Fatalf("claim %s not prepared", c.Name)
	}
	st := d.preparedStatus(c, rec)
	var data contract.DeviceStatusData
	if err := json.Unmarshal(st[0].Data.Raw, &data); err != nil {
		t.Fatal(err)
	}
	return data
}

// BenchmarkPrepareMIG: Prepare and Unprepare of one claim on a MIG partition of the simulated
// H200 (its MIG state written, atomically and fsync'd, at each change, as the crash tests need),
// beside the same for a share of a whole GPU in the same run.
func BenchmarkPrepareMIG(b *testing.B) {
	for _, device := range []string{"gpu-1", "gpu-0-mig-1g-18gb-0"} {
		b.Run(device, func(b *testing.B) {
			m := newMIGSim(b, filepath.Join(b.TempDir(), "mig.json"))
			d := m.driver(b)
			b.ResetTimer()
			for i := range b.N {
				c := apiClaim("c", fmt.Sprintf("b0000000-0000-4000-8000-%012d", i), result("gpu", device, "4Gi", "30"))
				res, err := d.PrepareResourceClaims(b.Context(), []*resourceapi.ResourceClaim{c})
				if err != nil || res[c.UID].Err != nil {
					b.Fatal(err, res[c.UID].Err)
				}
				if _, err := d.UnprepareResourceClaims(b.Context(), []kubeletplugin.NamespacedObject{{UID: c.UID}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestMIGModeNeedsAReset: a GPU whose MIG mode change waits for a reset refuses the partition
// with a clear error, reason mig, and nothing of the claim is left; the same claim is prepared
// once the GPU can change its mode.
func TestMIGModeNeedsAReset(t *testing.T) {
	m := newMIGSim(t, "")
	d := m.driver(t)
	gpu0 := m.devices[0].UUID
	if err := m.sim.SetMIGResetNeeded(gpu0, true); err != nil {
		t.Fatal(err)
	}
	c := apiClaim("p", "e0000000-0000-4000-8000-000000000005", result("gpu", "gpu-0-mig-1g-18gb-0", "", ""))
	err := prepare(t, d, c)[c.UID]
	if err == nil || !strings.Contains(err.Error(), "team/p") || !strings.Contains(err.Error(), "reset") || !strings.Contains(err.Error(), gpu0) {
		t.Fatalf("a partition on a GPU whose mode change needs a reset: %v", err)
	}
	if _, ok := d.deps.Checkpoint.Get(string(c.UID)); ok || fileExists(d.deps.CDI.SpecPath(string(c.UID))) {
		t.Error("the refused claim left a record or a CDI spec")
	}
	if got := d.metric(t, "vgpu_dra_prepare_errors_total", "reason", "mig"); got != 1 {
		t.Errorf("prepare errors with reason mig: %v, want 1", got)
	}
	if err := m.sim.SetMIGResetNeeded(gpu0, false); err != nil {
		t.Fatal(err)
	}
	if err := prepare(t, d, c)[c.UID]; err != nil {
		t.Fatalf("the kubelet's retry after the reset: %v", err)
	}
}

// TestTwoPartitionsOfOneGPU: a claim with two partitions of one GPU is refused before anything
// is made: its container's limits are named by the GPU's index, one per GPU.
func TestTwoPartitionsOfOneGPU(t *testing.T) {
	m := newMIGSim(t, "")
	d := m.driver(t)
	c := apiClaim("two", "f0000000-0000-4000-8000-000000000006",
		result("a", "gpu-0-mig-1g-18gb-0", "", ""), result("b", "gpu-0-mig-1g-18gb-1", "", ""))
	err := prepare(t, d, c)[c.UID]
	if err == nil || !strings.Contains(err.Error(), `"a" and "b"`) || !strings.Contains(err.Error(), "one MIG partition") {
		t.Fatalf("two partitions of GPU 0 in one claim: %v", err)
	}
	if list, _ := m.sim.MIGInstances(m.devices[0].UUID); len(list) != 0 {
		t.Errorf("the refused claim made instances: %+v", list)
	}
}
