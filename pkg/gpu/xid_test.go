package gpu

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestClassifyEvent(t *testing.T) {
	xid := uint64(nvml.EventTypeXidCriticalError)
	cases := []struct {
		name       string
		eventType  uint64
		data       uint64
		want       healthVerdict
		wantReason string
	}{
		{"application: graphics engine exception", xid, 13, verdictIgnore, "XID 13 (Graphics Engine Exception: illegal instruction or out-of-range access in a kernel)"},
		{"application: page fault", xid, 31, verdictIgnore, ""},
		{"application: stopped processing", xid, 43, verdictIgnore, ""},
		{"application: preemptive cleanup", xid, 45, verdictIgnore, ""},
		{"application: NVDEC", xid, 68, verdictIgnore, ""},
		{"application: context switch timeout", xid, 109, verdictIgnore, ""},
		{"fatal: DBE", xid, 48, verdictFatal, "XID 48 (double-bit ECC error)"},
		{"fatal: micro-controller halt", xid, 62, verdictFatal, ""},
		{"fatal: row remap failure", xid, 64, verdictFatal, ""},
		{"fatal: NVLink", xid, 74, verdictFatal, ""},
		{"fatal: off the bus", xid, 79, verdictFatal, "XID 79 (GPU has fallen off the bus)"},
		{"fatal: uncontained ECC", xid, 95, verdictFatal, ""},
		{"fatal: GSP timeout", xid, 119, verdictFatal, ""},
		{"fatal: GSP error", xid, 120, verdictFatal, ""},
		{"fatal: unrecovered ECC", xid, 140, verdictFatal, ""},
		{"unhealthy: row remap pending", xid, 63, verdictUnhealthy, "XID 63"},
		{"unhealthy: contained ECC", xid, 94, verdictUnhealthy, "XID 94"},
		{"unhealthy: unknown XID", xid, 999, verdictUnhealthy, "XID 999"},
		{"double-bit ECC event", nvml.EventTypeDoubleBitEccError, 0, verdictFatal, "double-bit ECC error"},
		{"GPU unavailable event", nvml.EventTypeGpuUnavailableError, 0, verdictFatal, "GPU unavailable"},
		{"simulated recovery", eventTypeSimulatedRecovery, 0, verdictRecovered, "marked healthy"},
		{"unrelated event", nvml.EventTypePState, 0, verdictIgnore, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := classifyEvent(tc.eventType, tc.data)
			if got != tc.want || (tc.wantReason != "" && reason != tc.wantReason) {
				t.Errorf("classifyEvent(%#x, %d) = %v, %q; want %v, %q", tc.eventType, tc.data, got, reason, tc.want, tc.wantReason)
			}
		})
	}
}

func TestXIDListsAreDisjoint(t *testing.T) {
	for xid := range applicationXIDs {
		if _, ok := fatalXIDs[xid]; ok {
			t.Errorf("XID %d is both an application error and fatal", xid)
		}
	}
	if healthEventTypes&eventTypeSimulatedRecovery != 0 || eventTypeSimulatedRecovery&nvml.EventTypeAll != 0 {
		t.Error("the simulated recovery type must not be an NVML event type")
	}
}
