package deviceplugin

import (
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// TestDevicesEveryWatcherSeesEveryChange: two watchers wait on the same generation; a change
// wakes both (one shared channel would wake one), and each then reads the new health. A
// repeated event is no change.
func TestDevicesEveryWatcherSeesEveryChange(t *testing.T) {
	inv := testInventory(t, 2, 2)
	d := newDevices(inv)
	_, w1 := d.list()
	_, w2 := d.list()
	bad := gpu.HealthEvent{UUID: inv.GPUs[1].Device.UUID, Healthy: false, Reason: "XID 79"}
	if !d.apply(bad) {
		t.Fatal("first fault: no change")
	}
	for i, w := range []<-chan struct{}{w1, w2} {
		select {
		case <-w:
		default:
			t.Fatalf("watcher %d not woken", i)
		}
	}
	list, w3 := d.list()
	var unhealthy []string
	for _, dev := range list {
		if dev.Health == pluginapi.Unhealthy {
			unhealthy = append(unhealthy, dev.ID)
		}
		if dev.Topology == nil || len(dev.Topology.Nodes) != 1 {
			t.Errorf("%s: topology %v, want the GPU's NUMA node", dev.ID, dev.Topology)
		}
	}
	if want := ids([2]int{1, 0}, [2]int{1, 1}); len(unhealthy) != 2 || unhealthy[0] != want[0] || unhealthy[1] != want[1] {
		t.Errorf("unhealthy shares %v, want %v", unhealthy, want)
	}
	if d.apply(bad) {
		t.Error("the same fault again counted as a change")
	}
	select {
	case <-w3:
		t.Fatal("woken without a change")
	default:
	}
	if !d.apply(gpu.HealthEvent{UUID: inv.GPUs[1].Device.UUID, Healthy: true}) {
		t.Fatal("recovery: no change")
	}
	<-w3
	if h, u := d.counts(); h != 4 || u != 0 {
		t.Errorf("after recovery %d healthy, %d unhealthy", h, u)
	}
}
