package gpu

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Which NVML events matter, and what each one means for the GPU. Sources: NVIDIA's Xid catalog
// (docs.nvidia.com/deploy/xid-errors, "Resolution Bucket (Immediate Action)") and the
// application-error list NVIDIA's device plugin has skipped for years.

// healthEventTypes are the NVML event types WatchHealth registers, masked per GPU by what the
// GPU supports.
const healthEventTypes uint64 = nvml.EventTypeXidCriticalError |
	nvml.EventTypeDoubleBitEccError |
	nvml.EventTypeGpuUnavailableError |
	nvml.EventTypeGpuRecoveryAction

// eventTypeSimulatedRecovery is not an NVML event type (NVML's highest bit is 0x8000 and it never
// sets this one). Only the simulated source emits it, for SetHealth(uuid, true, 0), so that a
// recovery travels the same queue, in order, as the faults before it. A real GPU recovers when
// NVML's recovery action goes back to none (recovery.go); one whose driver has no recovery
// action is trusted again when the plugin restarts after the GPU reset.
const eventTypeSimulatedRecovery uint64 = 1 << 63

// applicationXIDs are raised when one CUDA program misbehaves; the GPU itself stays usable and
// the next program runs fine. Marking the GPU unhealthy for them would let one tenant's buggy
// kernel take a shared GPU away from every other tenant, so they are ignored.
var applicationXIDs = map[uint64]string{
	8:   "GPU stopped processing: a channel's idle timeout (the catalogue's action: restart the application)",
	13:  "Graphics Engine Exception: illegal instruction or out-of-range access in a kernel",
	31:  "GPU memory page fault: a kernel touched an invalid address",
	43:  "GPU stopped processing: the faulting application's channel was torn down",
	45:  "Preemptive cleanup: channels of a killed or faulted application were cleaned up",
	68:  "NVDEC0 exception: the video decoder was fed a bad stream",
	109: "Context switch timeout: usually a kernel that never yields",
}

// fatalXIDs need a GPU reset (or more) before the GPU can run work again: work on it is lost,
// so the GPU is tainted NoExecute. Every XID outside both lists (e.g. 63 row-remap pending,
// 92 high single-bit ECC rate, 94 contained ECC error, 999 unknown) makes the GPU unhealthy but
// not fatal: no new work (NoSchedule), running work may finish. When it comes with NVML's
// recovery action at none, it decays after a quiet period (health.go, reportDecaying).
var fatalXIDs = map[uint64]string{
	48:  "double-bit ECC error",
	62:  "internal micro-controller halt",
	64:  "ECC page retirement or row remapping failure",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	95:  "uncontained ECC error",
	119: "GSP RPC timeout",
	120: "GSP error",
	140: "unrecovered ECC error",
}

// healthVerdict is what one NVML event means for its GPU.
type healthVerdict int

const (
	verdictIgnore healthVerdict = iota
	verdictUnhealthy
	verdictFatal
	verdictRecovered
)

// classifyEvent decides what an NVML event means, with a reason in words.
func classifyEvent(eventType, eventData uint64) (healthVerdict, string) {
	switch eventType {
	case nvml.EventTypeXidCriticalError:
		return classifyXID(eventData)
	case nvml.EventTypeDoubleBitEccError:
		return verdictFatal, "double-bit ECC error"
	case nvml.EventTypeGpuUnavailableError:
		return verdictFatal, "GPU unavailable"
	case eventTypeSimulatedRecovery:
		return verdictRecovered, "marked healthy"
	default:
		return verdictIgnore, fmt.Sprintf("NVML event type %#x", eventType)
	}
}

// classifyXID decides what one XID means.
func classifyXID(xid uint64) (healthVerdict, string) {
	if what, ok := applicationXIDs[xid]; ok {
		return verdictIgnore, fmt.Sprintf("XID %d (%s)", xid, what)
	}
	if what, ok := fatalXIDs[xid]; ok {
		return verdictFatal, fmt.Sprintf("XID %d (%s)", xid, what)
	}
	return verdictUnhealthy, fmt.Sprintf("XID %d", xid)
}
