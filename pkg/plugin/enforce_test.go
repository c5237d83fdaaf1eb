package plugin

import (
	"reflect"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
)

// TestAddLimits: a container's limit on a GPU is the memory of the claim results it uses there,
// added up; a whole-GPU or admin-access result leaves the GPU unlimited; results it does not use
// count for nothing; only a container with a limited result must register. Cores add up the
// same way; a GPU where they reach 100, or with a result without cores, has no core limit.
func TestAddLimits(t *testing.T) {
	devs := []checkpoint.Device{
		{GPUUUID: "GPU-a", MemoryBytes: 4 << 30, Cores: 20},
		{GPUUUID: "GPU-a", MemoryBytes: 2 << 30, Cores: 15},
		{GPUUUID: "GPU-b", MemoryBytes: 0}, // the whole GPU
		{GPUUUID: "GPU-c", AdminAccess: true},
		{GPUUUID: "GPU-d", MemoryBytes: 8 << 30, Cores: 50}, // not this container's
		{GPUUUID: "GPU-e", MemoryBytes: 1 << 30},            // memory only: all the SMs
		{GPUUUID: "GPU-f", MemoryBytes: 1 << 30, Cores: 60},
		{GPUUUID: "GPU-f", MemoryBytes: 1 << 30, Cores: 60}, // 120 points: no limit at all
	}
	var tg enforce.Target
	addLimits(&tg, devs, []int{0, 1, 2, 5, 6, 7}, []int{3})
	if want := map[string]uint64{"GPU-a": 6 << 30, "GPU-e": 1 << 30, "GPU-f": 2 << 30}; !reflect.DeepEqual(tg.Limits, want) {
		t.Errorf("limits %v, want %v", tg.Limits, want)
	}
	if want := map[string]bool{"GPU-b": true, "GPU-c": true}; !reflect.DeepEqual(tg.Unlimited, want) {
		t.Errorf("unlimited %v, want %v", tg.Unlimited, want)
	}
	if want := map[string]uint32{"GPU-a": 35}; !reflect.DeepEqual(tg.CoreLimits, want) {
		t.Errorf("core limits %v, want %v", tg.CoreLimits, want)
	}
	if !tg.MustRegister {
		t.Error("a container with limits need not register")
	}
	var monitor enforce.Target
	addLimits(&monitor, devs, nil, []int{3})
	if monitor.MustRegister || len(monitor.Limits) != 0 || len(monitor.CoreLimits) != 0 {
		t.Errorf("an admin-access container: %+v, want no limit and no registration", monitor)
	}
}

// TestAddLimitsClassesAndCeilings: the arbiter's terms come from the checkpoint (contract §16).
func TestAddLimitsClassesAndCeilings(t *testing.T) {
	devs := []checkpoint.Device{
		{GPUUUID: "GPU-a", Cores: 20, CoresCeiling: 60},
		{GPUUUID: "GPU-a", Cores: 10, CoresCeiling: 70}, // ceilings add up, at most 100
		{GPUUUID: "GPU-b", Cores: 10, Class: "BestEffort"},
		{GPUUUID: "GPU-c", Cores: 10, Class: "BestEffort", CoresCeiling: 40},
		{GPUUUID: "GPU-c", Cores: 10}, // a guaranteed share there: not best-effort
		{GPUUUID: "GPU-d", Cores: 25},
	}
	var tg enforce.Target
	addLimits(&tg, devs, []int{0, 1, 2, 3, 4, 5}, nil)
	if want := map[string]uint32{"GPU-a": 100, "GPU-b": 100, "GPU-c": 50, "GPU-d": 25}; !reflect.DeepEqual(tg.CoreCeilings, want) {
		t.Errorf("ceilings %v, want %v", tg.CoreCeilings, want)
	}
	if want := map[string]bool{"GPU-b": true}; !reflect.DeepEqual(tg.BestEffort, want) {
		t.Errorf("best-effort %v, want %v", tg.BestEffort, want)
	}
}
