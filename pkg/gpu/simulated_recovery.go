package gpu

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// simRecovery holds the simulated GPUs' recovery actions (recovery.go) and answers the mock's
// GetFieldValues for FI_DEV_GET_GPU_RECOVERY_ACTION, as a driver of R565 or later does.
type simRecovery struct {
	mu      sync.Mutex
	actions map[*server.Device]nvml.DeviceGpuRecoveryAction // absent: none
}

// installRecoveryMocks answers the recovery-action field on every visible GPU.
func (s *Simulated) installRecoveryMocks() {
	s.recovery = &simRecovery{actions: map[*server.Device]nvml.DeviceGpuRecoveryAction{}}
	for _, dev := range s.visible {
		dev.GetFieldValuesFunc = func(values []nvml.FieldValue) nvml.Return {
			for i := range values {
				if values[i].FieldId != nvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
					values[i].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
					continue
				}
				values[i].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
				values[i].NvmlReturn = uint32(nvml.SUCCESS)
				binary.LittleEndian.PutUint32(values[i].Value[:4], uint32(s.recovery.get(dev)))
			}
			return nvml.SUCCESS
		}
	}
}

func (r *simRecovery) get(dev *server.Device) nvml.DeviceGpuRecoveryAction {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.actions[dev]
}

// SetRecoveryAction sets what the simulated GPU needs to be usable again and sends NVML's
// recovery-action event, as the driver does when the action changes: a reset or reboot makes the
// GPU unhealthy (fatal), GPU_RECOVERY_ACTION_NONE makes it healthy again. The watcher reads the
// action through the same field query as on a real GPU.
func (s *Simulated) SetRecoveryAction(uuid string, action nvml.DeviceGpuRecoveryAction) error {
	i := slices.IndexFunc(s.visible, func(d *server.Device) bool { return d.UUID == uuid })
	if i < 0 {
		return fmt.Errorf("set recovery action of simulated GPU %s: no such GPU in profile %s with %d GPUs",
			uuid, s.profile, len(s.visible))
	}
	dev := s.visible[i]
	s.recovery.mu.Lock()
	s.recovery.actions[dev] = action
	s.recovery.mu.Unlock()
	data := nvml.EventData{Device: dev, EventType: nvml.EventTypeGpuRecoveryAction, EventData: uint64(action),
		GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	if err := s.events.deliver(dev, data); err != nil {
		return fmt.Errorf("set recovery action of simulated GPU %s: %w", uuid, err)
	}
	return nil
}
