package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// TestEnforcerRealProcesses runs the device plugin as Start builds it, with --enforce, over a
// simulated GPU cut into shares of 1 GiB and real processes in real pod cgroups that register
// with its real registry (the kubelet's record of who holds which share and the API server's
// pod UIDs behind the holder check). A pod over its share's memory and a pod whose process never
// registered lose their processes on the GPU within the grace and a period, with a Warning event
// each; a pod that holds two shares of the GPU, and so twice the memory, uses more than one share
// and is untouched. Without libvgpu.so installed no process can register: the pod over its share
// is still killed, the unregistered one within its share is not (it would be every pod's fate).
func TestEnforcerRealProcesses(t *testing.T) {
	for _, library := range []bool{true, false} {
		t.Run(map[bool]string{true: "library", false: "no-library"}[library], func(t *testing.T) { enforcerRealProcesses(t, library) })
	}
}

func enforcerRealProcesses(t *testing.T, library bool) {
	h := rt.Hierarchies(t)[0]
	root, err := os.MkdirTemp("/tmp", "vgde-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	sim, err := gpu.NewSimulated("dgx-h200", 1, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	devs, err := sim.Devices(context.Background())
	if err != nil || len(devs) != 1 {
		t.Fatalf("devices %v %v", devs, err)
	}
	uuid := devs[0].UUID
	share := func(n int) string { return ShareID(uuid, n) }
	kubelet := &fakeKubelet{}
	kubelet.set(fakePod{"ns", "over", resource, []string{share(0)}}, fakePod{"ns", "two", resource, []string{share(2), share(1)}},
		fakePod{"ns", "unreg", resource, []string{share(3)}})
	kube := fake.NewClientset(pod("ns", "over", uidA), pod("ns", "two", uidB), pod("ns", "unreg", uidD))
	cfg := Config{
		NodeName: "node-1", DriverName: "vgpu.dra.dev", ResourceName: resource,
		StateDir: filepath.Join(root, "s"), KubeletDir: filepath.Join(root, "k"), CDIDir: filepath.Join(root, "c"),
		Sizing: Sizing{SharesPerGPU: 4, ShareMemory: 1 * gib}, Policy: PolicyBinpack, GPUInjection: cdi.InjectionNone, DebugSocket: "-",
		Enforce: true, Enforcement: enforce.Settings{Period: 20 * time.Millisecond, Grace: 200 * time.Millisecond}, // no slack: 0
	}
	if library { // any file: the plugin installs it; the children register without it
		cfg.LibrarySource = filepath.Join(root, "libvgpu.so")
		if err := os.WriteFile(cfg.LibrarySource, []byte("ELF"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p, err := Start(context.Background(), cfg, Deps{KubeClient: kube, GPUs: sim, PodResources: kubelet})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(p.Stop)

	base := rt.NewCgroup(t, h)
	socket := cfg.Layout().RegistrySocket()
	// start runs a process in the pod's container cgroup that registers for the share (lead ""
	// registers nothing) and holds bytes on the GPU once it has.
	start := func(uid, lead string, bytes uint64) *rt.Child {
		spec := rt.Spec{Socket: socket}
		if lead != "" {
			sh, err := p.inv.Lookup(lead)
			if err != nil {
				t.Fatal(err)
			}
			spec.Request, spec.Count = registry.Request{RegisterUUID: sh.UID}, 1
		}
		ch := rt.StartChild(t, base.Sub(t, "pod"+uid+"/app"), spec)
		if rep := ch.Report(t); lead != "" && !slices.Equal(rep.Statuses, []string{registry.StatusOK.String()}) {
			t.Fatalf("registration of pod %s for share %s: %v %v", uid, lead, rep.Statuses, rep.Messages)
		}
		if err := sim.SetProcessUsage(uuid, ch.PID, bytes, nil); err != nil {
			t.Fatal(err)
		}
		return ch
	}
	over := start(uidA, share(0), 1536<<20) // one share: 1 GiB
	two := start(uidB, share(1), 1536<<20)  // two shares: 2 GiB
	unreg := start(uidD, "", 100<<20)       // never registered
	alive := func(pid int) bool { return syscall.Kill(pid, 0) == nil }
	deadline := time.Now().Add(10 * time.Second)
	for alive(over.PID) || (library && alive(unreg.PID)) {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: over alive %v, unregistered alive %v; want both killed", alive(over.PID), alive(unreg.PID))
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(10 * cfg.Enforcement.Period)
	if !alive(two.PID) {
		t.Error("the pod within its two shares lost its process")
	}
	wantPIDs := []int{two.PID}
	want := map[string]string{"over": "VGPUMemoryLimitExceeded", "unreg": "VGPUUnregisteredProcess"}
	if !library {
		if !alive(unreg.PID) {
			t.Error("without libvgpu.so on the node, the unregistered process within its share was killed")
		}
		wantPIDs = []int{unreg.PID, two.PID}
		delete(want, "unreg")
	}
	mem, err := sim.ProcessMemory(uuid)
	var pids []int
	for _, m := range mem {
		pids = append(pids, m.PID)
	}
	slices.Sort(pids)
	slices.Sort(wantPIDs)
	if err != nil || !slices.Equal(pids, wantPIDs) {
		t.Errorf("the GPU's processes after the kills: %+v %v, want %v", mem, err, wantPIDs)
	}
	got := map[string]string{}
	for deadline := time.Now().Add(10 * time.Second); len(got) < len(want) && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		list, err := kube.CoreV1().Events("ns").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		clear(got)
		for _, ev := range list.Items {
			got[ev.InvolvedObject.Name] = ev.Reason
		}
	}
	if len(got) != len(want) || got["over"] != want["over"] || got["unreg"] != want["unreg"] {
		t.Errorf("events by pod %v, want %v", got, want)
	}
}
