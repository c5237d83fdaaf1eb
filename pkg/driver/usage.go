package driver

import (
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
)

// PublishedCores is every GPU's cores capacity: 100 percent of its SMs (contract §2).
const PublishedCores = coresTotal

// GPUStates returns every GPU of the node in index order, in the usage sampler's terms, with the
// claims prepared on it (every checkpoint entry, half-prepared ones included: their capacity is
// taken). It reads one checkpoint snapshot and takes no lock a Prepare holds.
func (d *Driver) GPUStates() []usage.GPU {
	snap := d.deps.Checkpoint.Snapshot()
	out := make([]usage.GPU, len(d.devices))
	pos := make(map[string]int, len(d.devices))
	for i, g := range d.devices {
		_, bad := d.health.unhealthy(g.UUID)
		out[i] = usage.GPU{UUID: g.UUID, Device: DeviceName(g.Index), PublishedMemory: publishedMemory(g, d.cfg.MemoryReserve), Healthy: !bad}
		pos[g.UUID] = i
	}
	for _, c := range snap.Claims {
		for _, dev := range c.Devices {
			i, ok := pos[dev.GPUUUID]
			if !ok {
				continue // a GPU this node no longer has: nothing to show it against
			}
			if dev.AdminAccess {
				continue // a monitor next to the shares, not one of them
			}
			mem, cores := takenBy(dev, out[i].PublishedMemory)
			out[i].AllocatedMemory += mem
			out[i].AllocatedCores += cores
			out[i].Shares++
		}
	}
	return out
}

// takenBy is what one result takes of its GPU: the checkpoint records a whole GPU as 0, and an
// admin-access result takes nothing (contract §2: it is not a share).
func takenBy(dev checkpoint.Device, published int64) (mem, cores int64) {
	if dev.AdminAccess {
		return 0, 0
	}
	mem, cores = dev.MemoryBytes, dev.Cores
	if mem == 0 {
		mem = published
	}
	if cores == 0 {
		cores = coresTotal
	}
	return mem, cores
}
