package driver

import (
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
)

// TestGPUStates sums the prepared claims per GPU as the metrics show them: a whole-GPU result
// (recorded as 0) takes all of it, half-prepared claims count, admin access takes nothing, an
// unhealthy GPU says so.
func TestGPUStates(t *testing.T) {
	published := 79 * gib // 80 GiB minus the 1 GiB reserve
	tests := []struct {
		name      string
		claims    map[string]checkpoint.Claim
		unhealthy string
		want      []usage.GPU
	}{
		{
			name: "nothing prepared",
			want: []usage.GPU{
				{UUID: uuidGPU0, Device: "gpu-0", PublishedMemory: published, Healthy: true},
				{UUID: uuidGPU1, Device: "gpu-1", PublishedMemory: published, Healthy: true},
			},
		},
		{
			name: "two shares of one GPU and a whole other GPU",
			claims: map[string]checkpoint.Claim{
				"a": {State: checkpoint.PrepareCompleted, Devices: []checkpoint.Device{{Device: "gpu-0", GPUUUID: uuidGPU0, MemoryBytes: 10 * gib, Cores: 30}}},
				"b": {State: checkpoint.PrepareStarted, Devices: []checkpoint.Device{
					{Device: "gpu-0", GPUUUID: uuidGPU0, MemoryBytes: 4 * gib, Cores: 20},
					{Device: "gpu-1", GPUUUID: uuidGPU1},
				}},
				"gone": {State: checkpoint.PrepareCompleted, Devices: []checkpoint.Device{{Device: "gpu-7", GPUUUID: "GPU-of-another-inventory", MemoryBytes: gib, Cores: 1}}},
				// A monitor with admin access next to the shares: no share, nothing taken.
				"monitor": {State: checkpoint.PrepareCompleted, Devices: []checkpoint.Device{{Device: "gpu-0", GPUUUID: uuidGPU0, AdminAccess: true}}},
			},
			unhealthy: uuidGPU1,
			want: []usage.GPU{
				{UUID: uuidGPU0, Device: "gpu-0", PublishedMemory: published, AllocatedMemory: 14 * gib, AllocatedCores: 50, Shares: 2, Healthy: true},
				{UUID: uuidGPU1, Device: "gpu-1", PublishedMemory: published, AllocatedMemory: published, AllocatedCores: 100, Shares: 1},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := allocationDriver(true)
			store, err := checkpoint.Open(filepath.Join(t.TempDir(), "checkpoint.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Update(func(data *checkpoint.Data) error {
				data.Claims = tc.claims
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			d.deps.Checkpoint = store
			if tc.unhealthy != "" {
				d.health.set(gpu.HealthEvent{UUID: tc.unhealthy, Reason: "XID 79"}, time.Now())
			}
			if got := d.GPUStates(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("GPUStates =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}
