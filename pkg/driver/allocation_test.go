package driver

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

const (
	gib      = int64(1) << 30
	uuidGPU0 = "GPU-00000000-0000-0000-0000-000000000000"
	uuidGPU1 = "GPU-11111111-1111-1111-1111-111111111111"
	shareA   = "5f1c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f"
)

// allocationDriver is a driver over two 80 GiB GPUs of node "node-1", 1 GiB kept back on each.
func allocationDriver(vgpu bool) *Driver {
	devs := []gpu.Device{{Index: 0, UUID: uuidGPU0, MemoryBytes: uint64(80 * gib)}, {Index: 1, UUID: uuidGPU1, MemoryBytes: uint64(80 * gib)}}
	d := &Driver{
		cfg:     Config{DriverName: contract.DefaultDriverName, NodeName: "node-1", MemoryReserve: gib, VGPU: vgpu},
		devices: devs, byName: map[string]gpu.Device{}, health: newDeviceHealth(),
	}
	for _, g := range devs {
		d.byName[DeviceName(g.Index)] = g
	}
	return d
}

// result is one allocation result of our driver on node-1 with the given consumed capacity
// ("" leaves a capacity out).
func result(request, device, memory, cores string) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{
		Request: request, Driver: contract.DefaultDriverName, Pool: "node-1", Device: device,
		ShareID: ptr.To(types.UID(shareA)), ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{},
	}
	if memory != "" {
		r.ConsumedCapacity[contract.CapacityMemory] = resource.MustParse(memory)
	}
	if cores != "" {
		r.ConsumedCapacity[contract.CapacityCores] = resource.MustParse(cores)
	}
	return r
}

// admin marks a result as the scheduler does for an adminAccess request.
func admin(r resourceapi.DeviceRequestAllocationResult) resourceapi.DeviceRequestAllocationResult {
	r.AdminAccess = ptr.To(true)
	return r
}

func adminDev(d checkpoint.Device) checkpoint.Device {
	d.AdminAccess = true
	return d
}

func allocatedClaim(results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "c"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results},
		}},
	}
}

// vgpuConfigHead starts a VGPUConfig's JSON (contract §17); the fields and "}" follow.
const vgpuConfigHead = `{"apiVersion":"vgpu.dra.dev/v1alpha1","kind":"VGPUConfig",`

// configured gives the claim's allocation one VGPUConfig from the claim, for every request.
func configured(c *resourceapi.ResourceClaim, params string) *resourceapi.ResourceClaim {
	c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
		Source: resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: contract.DefaultDriverName, Parameters: runtime.RawExtension{Raw: []byte(params)}}},
	}}
	return c
}

// TestDevicesOf maps allocation results to what the checkpoint records, and refuses, with the
// metric reason and a message naming the device, what this node cannot serve.
func TestDevicesOf(t *testing.T) {
	other := result("nic", "eth0", "", "")
	other.Driver, other.Pool = "net.example.com", "elsewhere"
	foreignPool := result("gpu", "gpu-0", "", "")
	foreignPool.Pool = "node-2"
	tests := []struct {
		name       string
		vgpu       bool
		claim      *resourceapi.ResourceClaim
		unhealthy  string // GPU UUID to mark unhealthy first
		want       []checkpoint.Device
		wantReason string
		wantText   string
	}{
		{name: "sized share: memory in bytes, cores in percent", vgpu: true,
			claim: allocatedClaim(result("gpu", "gpu-1", "10Gi", "30")),
			want:  []checkpoint.Device{{Request: "gpu", Pool: "node-1", Device: "gpu-1", ShareID: shareA, GPUUUID: uuidGPU1, Index: 1, MemoryBytes: 10 * gib, Cores: 30}}},
		{name: "unsized request: whole GPU, recorded as 0 (unlimited)", vgpu: true,
			claim: allocatedClaim(result("gpu", "gpu-0", "", "")),
			want:  []checkpoint.Device{{Request: "gpu", Pool: "node-1", Device: "gpu-0", ShareID: shareA, GPUUUID: uuidGPU0}}},
		{name: "all of the published memory and 100 cores are unlimited", vgpu: true,
			claim: allocatedClaim(result("gpu", "gpu-0", "79Gi", "100")),
			want:  []checkpoint.Device{{Request: "gpu", Pool: "node-1", Device: "gpu-0", ShareID: shareA, GPUUUID: uuidGPU0}}},
		{name: "VGPUSupport off: capacity ignored", vgpu: false,
			claim: allocatedClaim(result("gpu", "gpu-0", "10Gi", "30")),
			want:  []checkpoint.Device{{Request: "gpu", Pool: "node-1", Device: "gpu-0", ShareID: shareA, GPUUUID: uuidGPU0}}},
		{name: "sub-request names are kept", vgpu: true,
			claim: allocatedClaim(result("gpu/small", "gpu-0", "1Gi", "")),
			want:  []checkpoint.Device{{Request: "gpu/small", Pool: "node-1", Device: "gpu-0", ShareID: shareA, GPUUUID: uuidGPU0, MemoryBytes: gib}}},
		{name: "another driver's results are skipped", vgpu: true,
			claim: allocatedClaim(other, result("gpu", "gpu-0", "1Gi", "")),
			want:  []checkpoint.Device{{Request: "gpu", Pool: "node-1", Device: "gpu-0", ShareID: shareA, GPUUUID: uuidGPU0, MemoryBytes: gib}}},
		{name: "only another driver's results: nothing", vgpu: true, claim: allocatedClaim(other)},
		{name: "admin access: no limits whatever was consumed", vgpu: true,
			claim: allocatedClaim(admin(result("mon", "gpu-0", "256Mi", "1"))),
			want:  []checkpoint.Device{{Request: "mon", Pool: "node-1", Device: "gpu-0", ShareID: shareA, GPUUUID: uuidGPU0, AdminAccess: true}}},
		{name: "admin access on an unhealthy GPU: an operator inspects it", vgpu: true, unhealthy: uuidGPU0,
			claim: allocatedClaim(admin(result("mon", "gpu-0", "", ""))),
			want:  []checkpoint.Device{{Request: "mon", Pool: "node-1", Device: "gpu-0", ShareID: shareA, GPUUUID: uuidGPU0, AdminAccess: true}}},
		{name: "admin access does not excuse a bad share in the same claim", vgpu: true,
			claim:      allocatedClaim(admin(result("mon", "gpu-0", "", "")), result("gpu", "gpu-1", "0.5", "")),
			wantReason: metrics.ReasonInvalidClaim, wantText: "not a positive whole number of bytes"},
		{name: "not allocated", vgpu: true, claim: &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "c"}},
			wantReason: metrics.ReasonInvalidClaim, wantText: "not allocated"},
		{name: "another node's pool", vgpu: true, claim: allocatedClaim(foreignPool),
			wantReason: metrics.ReasonInvalidClaim, wantText: "pool node-2 is not on this node"},
		{name: "unknown device", vgpu: true, claim: allocatedClaim(result("gpu", "gpu-9", "", "")),
			wantReason: metrics.ReasonInvalidClaim, wantText: "gpu-9 is not a GPU of node node-1"},
		{name: "unhealthy GPU", vgpu: true, claim: allocatedClaim(result("gpu", "gpu-1", "1Gi", "")), unhealthy: uuidGPU1,
			wantReason: metrics.ReasonUnhealthyDevice, wantText: "gpu-1 (" + uuidGPU1 + ") is unhealthy: XID 79"},
		{name: "memory not a multiple of 1Mi", vgpu: true, claim: allocatedClaim(result("gpu", "gpu-0", "1000001", "")),
			wantReason: metrics.ReasonInvalidClaim, wantText: "not a multiple of 1Mi"},
		{name: "fractional memory", vgpu: true, claim: allocatedClaim(result("gpu", "gpu-0", "0.5", "")),
			wantReason: metrics.ReasonInvalidClaim, wantText: "not a positive whole number of bytes"},
		{name: "zero cores", vgpu: true, claim: allocatedClaim(result("gpu", "gpu-0", "", "0")),
			wantReason: metrics.ReasonInvalidClaim, wantText: "not a whole number in 1–100"},
		{name: "cores over 100", vgpu: true, claim: allocatedClaim(result("gpu", "gpu-0", "", "101")),
			wantReason: metrics.ReasonInvalidClaim, wantText: "not a whole number in 1–100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := allocationDriver(tt.vgpu)
			if tt.unhealthy != "" {
				d.health.set(gpu.HealthEvent{UUID: tt.unhealthy, Reason: "XID 79"}, time.Now())
			}
			got, err := d.devicesOf(tt.claim)
			if tt.wantReason != "" {
				var pe *prepareError
				if !errors.As(err, &pe) || pe.reason != tt.wantReason || !strings.Contains(err.Error(), tt.wantText) || !strings.Contains(err.Error(), "team/c") {
					t.Fatalf("err = %v, want reason %s naming team/c and %q", err, tt.wantReason, tt.wantText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("devices = %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i].Request != tt.want[i].Request || got[i].Device != tt.want[i].Device || got[i].GPUUUID != tt.want[i].GPUUUID ||
					got[i].Index != tt.want[i].Index || got[i].ShareID != tt.want[i].ShareID ||
					got[i].MemoryBytes != tt.want[i].MemoryBytes || got[i].Cores != tt.want[i].Cores || got[i].Pool != tt.want[i].Pool ||
					got[i].AdminAccess != tt.want[i].AdminAccess {
					t.Errorf("device %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// TestCheckCapacity: the last line of defence adds every recorded claim's share of a GPU (an
// unlimited one counts as the whole GPU) and refuses the claim that would go past it.
func TestCheckCapacity(t *testing.T) {
	const self, other1, other2 = "self", "other-1", "other-2"
	dev := func(device, uuid string, mem, cores int64) checkpoint.Device {
		return checkpoint.Device{Device: device, GPUUUID: uuid, MemoryBytes: mem, Cores: cores}
	}
	tests := []struct {
		name     string
		prepared map[string][]checkpoint.Device
		claim    []checkpoint.Device
		wantErr  string
	}{
		{name: "fits exactly: 79 GiB published, 30+49 GiB", prepared: map[string][]checkpoint.Device{other1: {dev("gpu-0", uuidGPU0, 30*gib, 50)}},
			claim: []checkpoint.Device{dev("gpu-0", uuidGPU0, 49*gib, 50)}},
		{name: "memory one step over", prepared: map[string][]checkpoint.Device{other1: {dev("gpu-0", uuidGPU0, 30*gib, 10)}},
			claim: []checkpoint.Device{dev("gpu-0", uuidGPU0, 49*gib+contract.MemoryStep, 10)}, wantErr: "device gpu-0 would be overcommitted"},
		{name: "cores over 100", prepared: map[string][]checkpoint.Device{other1: {dev("gpu-0", uuidGPU0, gib, 60)}, other2: {dev("gpu-0", uuidGPU0, gib, 30)}},
			claim: []checkpoint.Device{dev("gpu-0", uuidGPU0, gib, 11)}, wantErr: "101% cores"},
		{name: "an unlimited claim takes the whole GPU", prepared: map[string][]checkpoint.Device{other1: {dev("gpu-0", uuidGPU0, 0, 0)}},
			claim: []checkpoint.Device{dev("gpu-0", uuidGPU0, gib, 1)}, wantErr: "overcommitted"},
		{name: "other GPU is not counted", prepared: map[string][]checkpoint.Device{other1: {dev("gpu-1", uuidGPU1, 0, 0)}},
			claim: []checkpoint.Device{dev("gpu-0", uuidGPU0, 0, 0)}},
		{name: "the claim's own earlier record is not counted twice", prepared: map[string][]checkpoint.Device{self: {dev("gpu-0", uuidGPU0, 0, 0)}},
			claim: []checkpoint.Device{dev("gpu-0", uuidGPU0, 0, 0)}},
		{name: "two results of one claim on one GPU add up", claim: []checkpoint.Device{dev("gpu-0", uuidGPU0, 40*gib, 50), dev("gpu-0", uuidGPU0, 40*gib, 50)},
			wantErr: "overcommitted"},
		{name: "admin access on a full GPU: not counted", prepared: map[string][]checkpoint.Device{other1: {dev("gpu-0", uuidGPU0, 0, 0)}},
			claim: []checkpoint.Device{adminDev(dev("gpu-0", uuidGPU0, 0, 0))}},
		{name: "a prepared admin-access claim takes nothing from a share", prepared: map[string][]checkpoint.Device{other1: {adminDev(dev("gpu-0", uuidGPU0, 0, 0))}},
			claim: []checkpoint.Device{dev("gpu-0", uuidGPU0, 0, 0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := allocationDriver(true)
			store, err := checkpoint.Open(filepath.Join(t.TempDir(), "checkpoint.json"))
			if err != nil {
				t.Fatal(err)
			}
			for uid, devs := range tt.prepared {
				if err := store.Put(uid, checkpoint.Claim{State: checkpoint.PrepareStarted, Devices: devs}); err != nil {
					t.Fatal(err)
				}
			}
			d.deps.Checkpoint, d.admitted = store, newAdmissions()
			_, err = d.admit(self, tt.claim)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var pe *prepareError
			if !errors.As(err, &pe) || pe.reason != metrics.ReasonOvercommitted || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %s mentioning %q", err, metrics.ReasonOvercommitted, tt.wantErr)
			}
		})
	}
}

// TestOnePerGPU: the per-claim path serves one directory set per claim, so two results on one
// GPU are refused naming both requests.
func TestOnePerGPU(t *testing.T) {
	ok := []checkpoint.Device{{Request: "a", Device: "gpu-0", GPUUUID: uuidGPU0}, {Request: "b", Device: "gpu-1", GPUUUID: uuidGPU1}}
	if err := onePerGPU(ok, nil); err != nil {
		t.Errorf("two GPUs: %v", err)
	}
	bad := []checkpoint.Device{{Request: "a", Device: "gpu-0", GPUUUID: uuidGPU0}, {Request: "b", Device: "gpu-0", GPUUUID: uuidGPU0}}
	if err := onePerGPU(bad, nil); err == nil || !strings.Contains(err.Error(), `"a" and "b"`) {
		t.Errorf("one GPU twice: %v, want an error naming both requests", err)
	}
}

// TestDevicesOfConfig: the claim's VGPUConfig lands on the checkpoint device, and a bad one
// fails Prepare with a message naming the field.
func TestDevicesOfConfig(t *testing.T) {
	withConfig := func(params string) *resourceapi.ResourceClaim {
		return configured(allocatedClaim(result("gpu", "gpu-0", "4Gi", "30")), params)
	}
	head := vgpuConfigHead
	d := allocationDriver(true)
	got, err := d.devicesOf(withConfig(head + `"class":"BestEffort","coresCeiling":100}`))
	if err != nil || len(got) != 1 || got[0].Class != "BestEffort" || got[0].CoresCeiling != 100 || got[0].Cores != 30 {
		t.Fatalf("devices %+v, %v; want class BestEffort, cores 30, ceiling 100", got, err)
	}
	got, err = d.devicesOf(allocatedClaim(result("gpu", "gpu-0", "4Gi", "30")))
	if err != nil || got[0].Class != "Guaranteed" || got[0].CoresCeiling != 0 {
		t.Fatalf("no config: devices %+v, %v; want Guaranteed without a ceiling", got, err)
	}
	for params, want := range map[string]string{
		head + `"coresCeiling":20}`: "status.allocation.devices.config[0].opaque.parameters.coresCeiling",
		head + `"klass":"x"}`:       `unknown field "klass"`,
		head + `"class":"Gold"}`:    "status.allocation.devices.config[0].opaque.parameters.class",
	} {
		_, err := d.devicesOf(withConfig(params))
		var pe *prepareError
		if !errors.As(err, &pe) || pe.reason != metrics.ReasonInvalidClaim || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want an invalid-claim error containing %q", params, err, want)
		}
	}
}
