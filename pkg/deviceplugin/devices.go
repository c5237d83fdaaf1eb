package deviceplugin

import (
	"maps"
	"sync"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// devices is the health of the node's GPUs, and the list of shares the kubelet is told about.
// Every ListAndWatch stream waits on its own for the next change: a change closes the current
// generation's channel, which wakes every waiting stream, and each then sends the list as it is
// now. No stream can take a change away from another (as one shared channel would), and a slow
// stream skips lists that a newer one has already superseded.
type devices struct {
	inv *Inventory

	mu        sync.Mutex
	unhealthy map[string]string // GPU UUID → reason
	changed   chan struct{}     // closed and replaced on every change
}

func newDevices(inv *Inventory) *devices {
	return &devices{inv: inv, unhealthy: map[string]string{}, changed: make(chan struct{})}
}

// apply records a health event and reports whether it changed anything.
func (d *devices) apply(ev gpu.HealthEvent) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	reason, was := d.unhealthy[ev.UUID]
	switch {
	case ev.Healthy && was:
		delete(d.unhealthy, ev.UUID)
	case !ev.Healthy && (!was || reason != ev.Reason):
		d.unhealthy[ev.UUID] = ev.Reason
	default:
		return false
	}
	close(d.changed)
	d.changed = make(chan struct{})
	return true
}

// gpuHealthy reports whether the GPU is healthy, and the reason it is not.
func (d *devices) gpuHealthy(uuid string) (bool, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	reason, bad := d.unhealthy[uuid]
	return !bad, reason
}

// list is every share as the kubelet sees it, with the channel that closes on the next change.
func (d *devices) list() ([]*pluginapi.Device, <-chan struct{}) {
	d.mu.Lock()
	unhealthy := maps.Clone(d.unhealthy)
	changed := d.changed
	d.mu.Unlock()
	out := make([]*pluginapi.Device, 0, len(d.inv.Shares))
	for _, sh := range d.inv.Shares {
		g := d.inv.GPUOf(sh)
		dev := &pluginapi.Device{ID: sh.ID, Health: pluginapi.Healthy}
		if _, bad := unhealthy[g.Device.UUID]; bad {
			dev.Health = pluginapi.Unhealthy
		}
		if g.Device.NUMANode != nil {
			dev.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(*g.Device.NUMANode)}}}
		}
		out = append(out, dev)
	}
	return out, changed
}

// counts is the number of healthy and unhealthy shares.
func (d *devices) counts() (healthy, unhealthy int) {
	list, _ := d.list()
	for _, dev := range list {
		if dev.Health == pluginapi.Healthy {
			healthy++
		} else {
			unhealthy++
		}
	}
	return healthy, unhealthy
}

// unhealthyGPUs is a copy of the unhealthy GPUs and their reasons.
func (d *devices) unhealthyGPUs() map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.unhealthy)
}
