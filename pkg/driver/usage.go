package driver

import (
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
)

// PublishedCores is every GPU's cores capacity: 100 percent of its SMs (contract §2).
const PublishedCores = coresTotal

// GPUStates returns every GPU of the node in index order, in the usage sampler's terms, with the
// claims prepared on it (every checkpoint entry, half-prepared ones included: their capacity is
// taken). It reads the checkpoint's running totals, walks no claim and takes no lock a Prepare
// holds.
func (d *Driver) GPUStates() []usage.GPU {
	recorded := d.deps.Checkpoint.Totals()
	out := make([]usage.GPU, len(d.devices))
	for i, g := range d.devices {
		_, bad := d.health.unhealthy(g.UUID)
		published := publishedMemory(g, d.cfg.MemoryReserve)
		t := recorded.GPU(g.UUID)
		mem, cores := takenOf(t, published)
		out[i] = usage.GPU{UUID: g.UUID, Device: DeviceName(g.Index), PublishedMemory: published, Healthy: !bad,
			AllocatedMemory: mem, AllocatedCores: cores, Shares: t.Results}
	}
	return out
}

// takenOf is what the results counted in t take of their GPU: the checkpoint records a whole GPU
// as 0, and counts no admin-access result (contract §2: it is not a share).
func takenOf(t checkpoint.GPUTotals, published int64) (mem, cores int64) {
	return t.MemoryBytes + int64(t.WholeMemory)*published, t.Cores + int64(t.WholeCores)*coresTotal
}
