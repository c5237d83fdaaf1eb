package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/health"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

const (
	regPodA  = "0b5a1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"
	regPodB  = "1c6b2d3e-4f5a-4b6c-9d7e-8f9a0b1c2d3e"
	regClaim = "3e8d4f5a-6b7c-4d8e-bf9a-0b1c2d3e4f5a"
	regUUID  = "2d7c3e4f-5a6b-4c7d-ae8f-9a0b1c2d3e4f"
)

// registryNode is a state dir laid out by claimdir, a checkpoint on disk and the registry
// server on the layout's socket, as the kubelet plugin assembles them.
type registryNode struct {
	layout claimdir.Layout
	store  *checkpoint.Store
	ctrs   *layoutContainers
	server *registry.Server
}

// layoutContainers stands in for the NRI cache adapter: the config dir comes from the
// layout, the cgroup from what "StartContainer" recorded.
type layoutContainers struct {
	layout claimdir.Layout
	synced bool
	byKey  map[string]registry.Container
}

func (l *layoutContainers) Synced() bool { return l.synced }

func (l *layoutContainers) Container(pod, name string) (registry.Container, bool) {
	c, ok := l.byKey[pod+"/"+name]
	return c, ok
}

func startRegistryNode(t *testing.T, h registry.CgroupHierarchy) *registryNode {
	t.Helper()
	return startRegistryNodeWith(t, h, fake.NewClientset())
}

// startRegistryNodeWith is startRegistryNode with the API server the registry reads claims
// from on a reservedFor miss.
func startRegistryNodeWith(t *testing.T, h registry.CgroupHierarchy, kube kubernetes.Interface) *registryNode {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "vgr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	layout := claimdir.Layout{StateDir: filepath.Join(dir, "state")}
	store, err := checkpoint.Open(filepath.Join(dir, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	n := &registryNode{layout: layout, store: store, ctrs: &layoutContainers{layout: layout, synced: true, byKey: map[string]registry.Container{}}}
	n.server, err = registry.Start(context.Background(), registry.Config{Socket: layout.RegistrySocket()}, registry.Deps{
		Containers: n.ctrs, Claims: plugin.PerClaimTargets(store, layout), Cgroups: &h,
		Reservations: plugin.ClaimReservations(store, kube),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.server.Stop)
	return n
}

func readPIDList(t *testing.T, configDir string) []int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(configDir, contract.PIDsConfigName))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, l := range strings.Fields(string(b)) {
		p, err := strconv.Atoi(l)
		if err != nil {
			t.Fatalf("pids.config line %q", l)
		}
		out = append(out, p)
	}
	return out
}

// TestRegistryPerClaimThroughCheckpoint: a claim prepared on the per-claim path (in the
// real checkpoint, with the layout's per-claim directories) is shared by two pods; one
// container of each registers by the claim's UUID and pids.config holds both. Once the
// claim is unprepared its UUID is NOT_FOUND.
func TestRegistryPerClaimThroughCheckpoint(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	n := startRegistryNode(t, h)
	if err := n.layout.EnsureClaimDir(regClaim); err != nil { // as Prepare does
		t.Fatal(err)
	}
	dirs, err := n.layout.EnsurePerClaimDirs(regClaim)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.store.Update(func(d *checkpoint.Data) error {
		if d.Claims == nil {
			d.Claims = map[string]checkpoint.Claim{}
		}
		d.Claims[regClaim] = checkpoint.Claim{Namespace: "ns", Name: "shared", State: checkpoint.PrepareCompleted,
			Path: contract.PathPerClaim, ReservedFor: []string{regPodA, regPodB}, RegisterUUID: regUUID}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	kube := rt.NewCgroup(t, h)
	ctrA := kube.Sub(t, "kubepods/besteffort/pod"+regPodA+"/ctr-a")
	ctrB := kube.Sub(t, "kubepods/burstable/pod"+regPodB+"/ctr-b")
	sock := n.layout.RegistrySocket()
	a := rt.StartChild(t, ctrA, rt.Spec{Socket: sock, Count: 1, Request: registry.Request{RegisterUUID: regUUID}})
	b := rt.StartChild(t, ctrB, rt.Spec{Socket: sock, Count: 1, Request: registry.Request{RegisterUUID: regUUID}})
	for name, ch := range map[string]*rt.Child{"A": a, "B": b} {
		if rep := ch.Report(t); rep.Statuses[0] != "OK" {
			t.Fatalf("pod %s: %s %s", name, rep.Statuses[0], rep.Messages[0])
		}
	}
	want := []int{a.PID, b.PID}
	slices.Sort(want)
	if got := readPIDList(t, dirs.Config); !slices.Equal(got, want) {
		t.Fatalf("pids.config = %v, want %v", got, want)
	}

	if err := n.store.Update(func(d *checkpoint.Data) error { delete(d.Claims, regClaim); return nil }); err != nil {
		t.Fatal(err)
	}
	late := rt.StartChild(t, ctrA, rt.Spec{Socket: sock, Count: 1, Request: registry.Request{RegisterUUID: regUUID}})
	if rep := late.Report(t); rep.Statuses[0] != "NOT_FOUND" {
		t.Fatalf("after unprepare: %s %s", rep.Statuses[0], rep.Messages[0])
	}
}

// TestRegistryPerClaimSecondPodFromAPIServer: a claim prepared on the per-claim path for one
// pod is shared by a second pod afterwards; the kubelet does not prepare it again, so only
// the API server knows the second pod. Its container's registration is OK — the registry
// reads the claim once and records the answer in the checkpoint, so the next registration
// of that pod reads nothing — and a pod the claim is not reserved for is still DENIED.
func TestRegistryPerClaimSecondPodFromAPIServer(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	regPodC := "4f9e5a6b-7c8d-4e9f-a0b1-c2d3e4f5a6b7"
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "shared", UID: types.UID(regClaim)},
		Status: resourceapi.ResourceClaimStatus{ReservedFor: []resourceapi.ResourceClaimConsumerReference{
			{Resource: "pods", Name: "a", UID: types.UID(regPodA)},
			{Resource: "pods", Name: "b", UID: types.UID(regPodB)},
		}},
	}
	kube := fake.NewClientset(claim)
	var gets atomic.Int32
	kube.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets.Add(1)
		return false, nil, nil
	})
	n := startRegistryNodeWith(t, h, kube)
	if err := n.layout.EnsureClaimDir(regClaim); err != nil { // as Prepare does
		t.Fatal(err)
	}
	dirs, err := n.layout.EnsurePerClaimDirs(regClaim)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.store.Update(func(d *checkpoint.Data) error {
		if d.Claims == nil {
			d.Claims = map[string]checkpoint.Claim{}
		}
		d.Claims[regClaim] = checkpoint.Claim{Namespace: "ns", Name: "shared", State: checkpoint.PrepareCompleted,
			Path: contract.PathPerClaim, ReservedFor: []string{regPodA}, RegisterUUID: regUUID}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	kubepods := rt.NewCgroup(t, h)
	ctrB := kubepods.Sub(t, "kubepods/burstable/pod"+regPodB+"/ctr-b")
	ctrC := kubepods.Sub(t, "kubepods/burstable/pod"+regPodC+"/ctr-c")
	sock := n.layout.RegistrySocket()
	req := registry.Request{RegisterUUID: regUUID}

	b := rt.StartChild(t, ctrB, rt.Spec{Socket: sock, Count: 1, Request: req})
	if rep := b.Report(t); rep.Statuses[0] != "OK" {
		t.Fatalf("second pod, reserved in the API server only: %s %s; want OK", rep.Statuses[0], rep.Messages[0])
	}
	if got := readPIDList(t, dirs.Config); !slices.Equal(got, []int{b.PID}) {
		t.Fatalf("pids.config = %v, want [%d]", got, b.PID)
	}
	// The read's answer is recorded in the background (never inside a registration's or a
	// hook's deadline); wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		cl, ok := n.store.Get(regClaim)
		if ok && slices.Equal(cl.ReservedFor, []string{regPodA, regPodB}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checkpoint reservedFor after the read: %v, want [%s %s]", cl.ReservedFor, regPodA, regPodB)
		}
		time.Sleep(5 * time.Millisecond)
	}
	readsForB := gets.Load()
	b2 := rt.StartChild(t, ctrB, rt.Spec{Socket: sock, Count: 1, Request: req})
	if rep := b2.Report(t); rep.Statuses[0] != "OK" {
		t.Fatalf("second pod again: %s %s", rep.Statuses[0], rep.Messages[0])
	}
	if readsForB != 1 || gets.Load() != readsForB {
		t.Fatalf("API reads of the claim: %d for the first registration, %d after the second; want 1, then none", readsForB, gets.Load())
	}

	c := rt.StartChild(t, ctrC, rt.Spec{Socket: sock, Count: 1, Request: req})
	if rep := c.Report(t); rep.Statuses[0] != "DENIED" {
		t.Fatalf("pod the claim is not reserved for: %s %s; want DENIED", rep.Statuses[0], rep.Messages[0])
	}
}

// TestRegistryNRIPathLayout: a container whose directories NRI created through the layout
// registers over the layout's socket; pids.config lands in its config directory; the socket
// directory is 0711 and the health service's registry check passes.
func TestRegistryNRIPathLayout(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	n := startRegistryNode(t, h)
	if err := n.layout.EnsureClaimDir(regClaim); err != nil { // as Prepare does
		t.Fatal(err)
	}
	dirs, err := n.layout.EnsureContainerDirs(regClaim, regPodA, "app")
	if err != nil {
		t.Fatal(err)
	}
	ctr := rt.NewCgroup(t, h)
	initProc := rt.StartChild(t, ctr, rt.Spec{})
	n.ctrs.byKey[regPodA+"/app"] = registry.Container{ID: "c1", ClaimUID: regClaim, ConfigDir: dirs.Config, InitPID: initProc.PID}

	app := rt.StartChild(t, ctr, rt.Spec{Socket: n.layout.RegistrySocket(), Count: 1,
		Request: registry.Request{PodUID: regPodA, ContainerName: "app", ClientVersion: "integration"}})
	if rep := app.Report(t); rep.Statuses[0] != "OK" {
		t.Fatalf("register: %s %s", rep.Statuses[0], rep.Messages[0])
	}
	want := []int{initProc.PID, app.PID}
	slices.Sort(want)
	if got := readPIDList(t, dirs.Config); !slices.Equal(got, want) {
		t.Fatalf("pids.config = %v, want %v", got, want)
	}
	st, err := os.Stat(n.layout.RegistryDir())
	if err != nil || st.Mode().Perm() != 0o711 {
		t.Fatalf("registry dir: %v, %v", st.Mode(), err)
	}

	hs := health.NewServer()
	hs.Add("registry", n.server.Check)
	if err := hs.Evaluate(context.Background()); err != nil {
		t.Fatalf("health with the registry serving: %v", err)
	}
	n.server.Stop()
	if err := hs.Evaluate(context.Background()); err == nil {
		t.Fatal("health passed with the registry stopped")
	}
}
