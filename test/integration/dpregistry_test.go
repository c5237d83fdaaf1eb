package integration

import (
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vgpu-dra/vgpu-dra/pkg/deviceplugin"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// TestDevicePluginRegistryChecksTheHolder: a process registers with the register UUID of its
// share (the lead's, from vgpu.config) over the real socket, from a real pod cgroup. It passes
// only while the kubelet's pod-resources API lists its pod — by the UID the API server gives
// that name — with the share: another pod using the same UUID is DENIED, and once the share
// passes to that other pod, the first is DENIED and the second passes. pids.config lands in the
// share's config directory.
func TestDevicePluginRegistryChecksTheHolder(t *testing.T) {
	h := rt.Hierarchies(t)[0] // the one the plugin's registry detects
	n := newDPNode(t)
	for _, p := range []struct{ name, uid string }{{"a", regPodA}, {"b", regPodB}} {
		if _, err := n.kube.CoreV1().Pods("ns").Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: p.name, UID: types.UID(p.uid)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n.startKubelet()
	n.start()
	n.waitAllocatable(2 * dpShares)
	share := deviceplugin.ShareID(n.gpuUUID(0), 1)
	resp, err := n.kubelet.allocate("ns", "a", share)
	if err != nil {
		t.Fatal(err)
	}
	uuid := resp.Envs["MANAGER_CLIENT_REGISTER_UUID"]
	kube := rt.NewCgroup(t, h)
	ctrA := kube.Sub(t, "kubepods/besteffort/pod"+regPodA+"/ctr-a")
	ctrB := kube.Sub(t, "kubepods/besteffort/pod"+regPodB+"/ctr-b")
	socket := n.cfg.Layout().RegistrySocket()
	register := func(cg rt.Cgroup) (string, int) {
		c := rt.StartChild(t, cg, rt.Spec{Socket: socket, Count: 1, Once: true, Request: registry.Request{RegisterUUID: uuid}})
		rep := c.Report(t)
		return rep.Statuses[0] + " " + rep.Messages[0], c.PID
	}
	got, pidA := register(ctrA)
	if got != "OK " {
		t.Fatalf("the holder pod: %s", got)
	}
	if got, _ := register(ctrB); got[:6] != "DENIED" {
		t.Fatalf("another pod with the holder's register UUID: %s", got)
	}
	dirs, err := n.cfg.Layout().PerClaimDirs(uuid)
	if err != nil {
		t.Fatal(err)
	}
	if pids := readPIDList(t, dirs.Config); !slices.Equal(pids, []int{pidA}) {
		t.Errorf("pids.config in %s = %v, want [%d]", filepath.Base(filepath.Dir(dirs.Config)), pids, pidA)
	}

	// The share passes to pod b (pod a is gone as far as the kubelet knows).
	n.kubelet.mu.Lock()
	n.kubelet.held = nil
	n.kubelet.mu.Unlock()
	if _, err := n.kubelet.allocate("ns", "b", share); err != nil {
		t.Fatal(err)
	}
	if got, _ := register(ctrA); got[:6] != "DENIED" {
		t.Errorf("the former holder: %s", got)
	}
	if got, _ := register(ctrB); got != "OK " {
		t.Errorf("the new holder: %s", got)
	}
}
