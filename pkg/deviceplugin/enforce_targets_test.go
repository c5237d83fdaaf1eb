package deviceplugin

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
)

const uidD = "3e8d4f5a-6b7c-4d8e-9f0a-1b2c3d4e5f6a"

var podGVR = corev1.SchemeGroupVersion.WithResource("pods")

// podCgroup is a container cgroup of the pod with that UID, as the kubelet (cgroupfs) names it.
func podCgroup(uid string) string {
	return "/kubepods/burstable/pod" + uid + "/cri-containerd-0123abcd.scope"
}

// TestShareTarget: a pod's limit on a GPU is its containers' shares there, k shares k times a
// share's memory and cores; the cores of a GPU are no limit once a share's are unlimited or they
// add up to 100; every share has a memory limit, so the pod must register; each container's
// lead share names a config directory, and the pod is matched by its UID.
func TestShareTarget(t *testing.T) {
	layout := claimdir.Layout{StateDir: "/var/lib/vgpu-dra"}
	inventory := func(s Sizing) *Inventory {
		inv, err := NewInventory(testGPUs(2, 80*gib), s, resource)
		if err != nil {
			t.Fatal(err)
		}
		return inv
	}
	g0, g1 := testGPUs(2, 0)[0].UUID, testGPUs(2, 0)[1].UUID
	configOf := func(inv *Inventory, shareID string) string {
		d, err := layout.PerClaimDirs(inv.byID[shareID].UID)
		if err != nil {
			t.Fatal(err)
		}
		return d.Config
	}
	pod := podRef{"ns", "a"}
	set := func(container string, pairs ...[2]int) heldSet {
		return heldSet{pod: pod, container: container, ids: ids(pairs...)}
	}
	cores20 := inventory(Sizing{SharesPerGPU: 4, ShareCores: 20}) // 20 GiB and 20 % a share
	cores30 := inventory(Sizing{SharesPerGPU: 4, ShareCores: 30})
	whole := inventory(Sizing{SharesPerGPU: 1, MemoryReserve: 1 * gib})
	tests := []struct {
		name       string
		inv        *Inventory
		sets       []heldSet
		limits     map[string]uint64
		cores      map[string]uint32
		configDirs []string // ConfigDir, then ConfigDirs
		container  string
	}{
		{"one container, two shares of one GPU and one of another", cores20, []heldSet{set("app", [2]int{1, 2}, [2]int{0, 1}, [2]int{0, 0})},
			map[string]uint64{g0: 40 * gib, g1: 20 * gib}, map[string]uint32{g0: 40, g1: 20}, []string{configOf(cores20, id(0, 0))}, "app"},
		{"two containers of one pod add up", cores20, []heldSet{set("a", [2]int{0, 2}), set("b", [2]int{0, 3}, [2]int{1, 0})},
			map[string]uint64{g0: 40 * gib, g1: 20 * gib}, map[string]uint32{g0: 40, g1: 20},
			[]string{configOf(cores20, id(0, 2)), configOf(cores20, id(0, 3))}, "a,b"},
		{"four shares' cores are the whole GPU", cores30, []heldSet{set("app", [2]int{0, 0}, [2]int{0, 1}, [2]int{0, 2}, [2]int{0, 3})},
			map[string]uint64{g0: 80 * gib}, map[string]uint32{}, []string{configOf(cores30, id(0, 0))}, "app"},
		{"two containers' cores past 100", cores30, []heldSet{set("a", [2]int{0, 0}, [2]int{0, 1}), set("b", [2]int{0, 2}, [2]int{0, 3})},
			map[string]uint64{g0: 80 * gib}, map[string]uint32{}, []string{configOf(cores30, id(0, 0)), configOf(cores30, id(0, 2))}, "a,b"},
		{"a whole GPU: its memory after the reserve, no core limit", whole, []heldSet{set("app", [2]int{1, 0})},
			map[string]uint64{g1: 79 * gib}, map[string]uint32{}, []string{configOf(whole, id(1, 0))}, "app"},
		{"shares this node does not offer count for nothing", cores20, []heldSet{set("a", [2]int{0, 1}), {pod: pod, container: "old", ids: []string{"GPU-gone::0"}}},
			map[string]uint64{g0: 20 * gib}, map[string]uint32{g0: 20}, []string{configOf(cores20, id(0, 1))}, "a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tg, ok := tc.inv.target(layout, pod, uidA, tc.sets)
			if !ok {
				t.Fatal("no target")
			}
			if !reflect.DeepEqual(tg.Limits, tc.limits) || !reflect.DeepEqual(tg.CoreLimits, tc.cores) || len(tg.Unlimited) != 0 {
				t.Errorf("limits %v, cores %v, unlimited %v; want %v, %v, none", tg.Limits, tg.CoreLimits, tg.Unlimited, tc.limits, tc.cores)
			}
			if got := append([]string{tg.ConfigDir}, tg.ConfigDirs...); !slices.Equal(got, tc.configDirs) {
				t.Errorf("config dirs %q, want %q", got, tc.configDirs)
			}
			if !tg.MustRegister || tg.Container != tc.container || tg.PodUID != uidA || !slices.Equal(tg.Pods, []string{uidA}) ||
				tg.Namespace != "ns" || tg.Pod != "a" || len(tg.Cgroups) != 0 {
				t.Errorf("target %+v: want pod ns/a (%s) matched by UID, container %q, registration required", tg, uidA, tc.container)
			}
		})
	}
	if _, ok := cores20.target(layout, pod, uidA, []heldSet{{pod: pod, container: "old", ids: []string{"GPU-gone::0"}}}); ok {
		t.Error("a pod that holds no share of this node is a target")
	}
}

// sourceNode is a targetSource over a fake kubelet and API server that counts its pod reads and
// can fail them.
type sourceNode struct {
	kubelet *fakeKubelet
	kube    *fake.Clientset
	src     *targetSource
	gets    int
	failGet map[string]bool // pod names whose reads fail
}

func newSourceNode(t *testing.T) *sourceNode {
	n := &sourceNode{kubelet: &fakeKubelet{}, kube: fake.NewClientset(pod("ns", "a", uidA), pod("ns", "b", uidB)), failGet: map[string]bool{}}
	n.kube.PrependReactor("get", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		n.gets++
		if n.failGet[a.(k8stesting.GetAction).GetName()] {
			return true, nil, errors.New("the server was unable to return a response in the time allotted")
		}
		return false, nil, nil
	})
	n.src = newTargetSource(testInventory(t, 2, 4), claimdir.Layout{StateDir: "/var/lib/vgpu-dra"},
		&holders{kubelet: n.kubelet, kube: n.kube, resource: resource}, logr.Discard())
	return n
}

func (n *sourceNode) refresh(t *testing.T) {
	t.Helper()
	if err := n.src.refresh(context.Background()); err != nil {
		t.Fatalf("refresh: %v", err)
	}
}

// pods are the UIDs of the targets, "pending" for the pending one.
func (n *sourceNode) pods() []string {
	var out []string
	for _, tg := range n.src.snapshot() {
		if tg.Key == "pending" {
			out = append(out, "pending")
			continue
		}
		out = append(out, tg.PodUID)
	}
	return out
}

// TestTargetSource: the targets are the pods the kubelet lists with shares, by the UID the API
// server gives their names, read once per pod. A pod the API server no longer has is no target;
// one whose UID cannot be read yet is held by the pending target (unlimited, so neither enforced
// nor foreign) until it can; a kubelet that does not answer leaves the targets as they were; a
// pod re-created under its name is found by its new UID once the enforcer sees a process of it.
func TestTargetSource(t *testing.T) {
	n := newSourceNode(t)
	if n.src.ready() {
		t.Fatal("ready before the first refresh")
	}
	n.kubelet.set(fakePod{"ns", "a", resource, ids([2]int{0, 0})}, fakePod{"ns", "b", resource, ids([2]int{0, 1}, [2]int{1, 1})},
		fakePod{"ns", "gone", resource, ids([2]int{1, 0})}, fakePod{"ns", "other", "example.com/gpu", []string{"x"}})
	n.refresh(t)
	if !n.src.ready() || !slices.Equal(n.pods(), []string{uidA, uidB}) {
		t.Fatalf("ready %v, targets %v; want a and b", n.src.ready(), n.pods())
	}
	if pod, ok := n.src.podOf(podCgroup(uidA)); !ok || pod != uidA {
		t.Errorf("podOf(a's container) = %q, %v", pod, ok)
	}
	if _, ok := n.src.podOf("/system.slice/containerd.service"); ok {
		t.Error("a process outside any pod has a pod")
	}
	gets := n.gets
	n.refresh(t)
	if n.gets != gets {
		t.Errorf("a refresh read %d pods again; their UIDs are kept while the kubelet lists them", n.gets-gets)
	}

	// A new pod whose UID cannot be read: pending, and its processes held by the pending target.
	if err := n.kube.Tracker().Add(pod("ns", "d", uidD)); err != nil {
		t.Fatal(err)
	}
	n.failGet["d"] = true
	n.kubelet.set(fakePod{"ns", "a", resource, ids([2]int{0, 0})}, fakePod{"ns", "b", resource, ids([2]int{0, 1}, [2]int{1, 1})},
		fakePod{"ns", "d", resource, ids([2]int{0, 2})})
	n.refresh(t)
	if !slices.Equal(n.pods(), []string{uidA, uidB, "pending"}) {
		t.Fatalf("targets %v, want a, b and the pending one", n.pods())
	}
	pending := n.src.snapshot()[2]
	if pod, ok := n.src.podOf(podCgroup(uidD)); !ok || !slices.Equal(pending.Pods, []string{pod}) {
		t.Errorf("podOf(d's container) = %q, %v; want the pending target's %v", pod, ok, pending.Pods)
	}
	for _, g := range n.src.inv.GPUs {
		if !pending.Unlimited[g.Device.UUID] || pending.MustRegister {
			t.Errorf("the pending target %+v limits GPU %s", pending, g.Device.UUID)
		}
	}
	if pod, _ := n.src.podOf(podCgroup(uidA)); pod != uidA {
		t.Errorf("podOf(a's container) = %q while d is pending", pod)
	}
	n.failGet["d"] = false
	n.refresh(t)
	if !slices.Equal(n.pods(), []string{uidA, uidB, uidD}) {
		t.Fatalf("targets %v once d's UID is read", n.pods())
	}

	// The kubelet does not answer: the targets stay.
	n.kubelet.err = errors.New("connection refused")
	if err := n.src.refresh(context.Background()); err == nil {
		t.Error("refresh without a kubelet succeeded")
	}
	if !n.src.ready() || !slices.Equal(n.pods(), []string{uidA, uidB, uidD}) {
		t.Errorf("targets %v after a failed refresh", n.pods())
	}
	n.kubelet.err = nil

	// a is re-created under its name between two refreshes: its old UID is kept until a process
	// of the new one is seen, then every UID is read again.
	const uidA2 = "4f9e5a6b-7c8d-4e9f-8a1b-2c3d4e5f6a7b"
	if err := n.kube.Tracker().Delete(podGVR, "ns", "a"); err != nil {
		t.Fatal(err)
	}
	if err := n.kube.Tracker().Add(pod("ns", "a", uidA2)); err != nil {
		t.Fatal(err)
	}
	n.refresh(t)
	if n.pods()[0] != uidA {
		t.Fatalf("targets %v: the UID was read again without a reason", n.pods())
	}
	if pod, ok := n.src.podOf(podCgroup(uidA2)); !ok || pod != uidA2 {
		t.Errorf("podOf(the new a's container) = %q, %v", pod, ok)
	}
	n.refresh(t)
	if !slices.Equal(n.pods(), []string{uidA2, uidB, uidD}) {
		t.Errorf("targets %v, want the new a", n.pods())
	}
	gets = n.gets
	n.src.podOf(podCgroup(uidA2))
	n.src.podOf(podCgroup("5a0f6b7c-8d9e-4f0a-9b2c-3d4e5f6a7b8c")) // a pod of no target, seen again and again
	n.refresh(t)
	n.src.podOf(podCgroup("5a0f6b7c-8d9e-4f0a-9b2c-3d4e5f6a7b8c"))
	n.refresh(t)
	if n.gets-gets != 3 {
		t.Errorf("%d pod reads for one unknown pod seen in two passes, want one read of each of the 3 pods", n.gets-gets)
	}
}
