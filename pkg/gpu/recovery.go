package gpu

import (
	"encoding/binary"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML tells what a GPU needs to be usable again through its recovery action (field
// FI_DEV_GET_GPU_RECOVERY_ACTION, and the event EventTypeGpuRecoveryAction when it changes,
// drivers R565 and later). It is the one signal of a real GPU coming back: once the action is
// back to none — the GPU was reset, or the driver cleared it — the GPU is trusted again without a
// plugin restart.

// recoveryActionNames are NVML's recovery actions in words.
var recoveryActionNames = map[nvml.DeviceGpuRecoveryAction]string{
	nvml.GPU_RECOVERY_ACTION_NONE:                "none",
	nvml.GPU_RECOVERY_ACTION_GPU_RESET:           "GPU reset",
	nvml.GPU_RECOVERY_ACTION_NODE_REBOOT:         "node reboot",
	nvml.GPU_RECOVERY_ACTION_DRAIN_P2P:           "drain peer-to-peer traffic",
	nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:     "drain and reset",
	nvml.GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN: "recover the IMEX domain",
	nvml.GPU_RECOVERY_ACTION_BUS_RESET:           "bus reset",
	nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT:       "system reboot",
}

// classifyRecoveryAction decides what a recovery action means for the GPU. None: recovered.
// Draining peer-to-peer traffic or recovering the IMEX domain leaves the GPU's own work running
// (unhealthy, no new work); every action that resets or reboots loses the work on it (fatal).
// An action this code does not know is unhealthy, never ignored.
func classifyRecoveryAction(action nvml.DeviceGpuRecoveryAction) (healthVerdict, string) {
	name, known := recoveryActionNames[action]
	if !known {
		name = fmt.Sprintf("unknown (%d)", action)
	}
	reason := "recovery action " + name
	switch action {
	case nvml.GPU_RECOVERY_ACTION_NONE:
		return verdictRecovered, "recovery action back to none"
	case nvml.GPU_RECOVERY_ACTION_GPU_RESET, nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
		nvml.GPU_RECOVERY_ACTION_BUS_RESET, nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT:
		return verdictFatal, reason
	default:
		return verdictUnhealthy, reason
	}
}

// recoveryAction reads the GPU's current recovery action. An event's own data is not documented
// to carry it, so the field is asked; fallback (the event's data) serves when the field cannot
// be read.
func recoveryAction(dev nvml.Device, fallback uint64) nvml.DeviceGpuRecoveryAction {
	values := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := dev.GetFieldValues(values); ret != nvml.SUCCESS || nvml.Return(values[0].NvmlReturn) != nvml.SUCCESS {
		return nvml.DeviceGpuRecoveryAction(fallback)
	}
	return nvml.DeviceGpuRecoveryAction(fieldValue(values[0]))
}

// fieldValue decodes an integer field value in the host's byte order (little-endian on every
// platform NVML supports).
func fieldValue(v nvml.FieldValue) uint64 {
	switch nvml.ValueType(v.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.LittleEndian.Uint32(v.Value[:4]))
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.LittleEndian.Uint16(v.Value[:2]))
	default:
		return binary.LittleEndian.Uint64(v.Value[:])
	}
}
