package gpu

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestRecoveryAction: NVML's recovery action, read through the field query the real source
// uses, makes a GPU unhealthy (fatal when the action resets or reboots) and healthy again when
// it goes back to none — also for a GPU an XID made unhealthy.
func TestRecoveryAction(t *testing.T) {
	sim := newWatchedSimulated(t, 2)
	uuid := func(i int) string { return sim.visible[i].UUID }
	events := watch(t, sim)
	type step struct {
		name   string
		gpu    int
		xid    uint64 // an XID instead of an action
		action nvml.DeviceGpuRecoveryAction
		want   *HealthEvent
	}
	steps := []step{
		{name: "none on a healthy GPU is no change", gpu: 0, action: nvml.GPU_RECOVERY_ACTION_NONE},
		{name: "drain P2P: unhealthy, not fatal", gpu: 0, action: nvml.GPU_RECOVERY_ACTION_DRAIN_P2P,
			want: &HealthEvent{Reason: "recovery action drain peer-to-peer traffic"}},
		{name: "GPU reset: fatal", gpu: 0, action: nvml.GPU_RECOVERY_ACTION_GPU_RESET,
			want: &HealthEvent{Fatal: true, Reason: "recovery action GPU reset"}},
		{name: "back to none: healthy", gpu: 0, action: nvml.GPU_RECOVERY_ACTION_NONE,
			want: &HealthEvent{Healthy: true, Reason: "recovery action back to none"}},
		{name: "an XID", gpu: 1, xid: 79, want: &HealthEvent{Fatal: true, Reason: "XID 79 (GPU has fallen off the bus)"}},
		{name: "the driver asks for a reset", gpu: 1, action: nvml.GPU_RECOVERY_ACTION_GPU_RESET},
		{name: "reset done: healthy", gpu: 1, action: nvml.GPU_RECOVERY_ACTION_NONE,
			want: &HealthEvent{Healthy: true, Reason: "recovery action back to none"}},
		{name: "an action this code does not know: unhealthy", gpu: 1, action: 42,
			want: &HealthEvent{Reason: "recovery action unknown (42)"}},
	}
	for _, st := range steps {
		var err error
		if st.xid != 0 {
			err = sim.SetHealth(uuid(st.gpu), false, st.xid)
		} else {
			err = sim.SetRecoveryAction(uuid(st.gpu), st.action)
		}
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if st.want == nil {
			continue
		}
		want := *st.want
		want.UUID = uuid(st.gpu)
		if got := next(t, events); got != want {
			t.Errorf("%s: got %+v, want %+v", st.name, got, want)
		}
	}
}

// TestPendingRecoveryActionAtStart: a GPU that already waits for a reset when the watch starts
// (the plugin restarted after the fault) is reported at once, without an event.
func TestPendingRecoveryActionAtStart(t *testing.T) {
	sim := newWatchedSimulated(t, 2)
	sim.recovery.actions[sim.visible[1]] = nvml.GPU_RECOVERY_ACTION_NODE_REBOOT
	events := watch(t, sim)
	want := HealthEvent{UUID: sim.visible[1].UUID, Fatal: true, Reason: "recovery action node reboot"}
	if got := next(t, events); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}
