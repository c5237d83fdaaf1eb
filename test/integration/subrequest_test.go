package integration

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

const (
	shareS1 = "5b000001-0000-4000-8000-000000000000"
	shareS2 = "5b000002-0000-4000-8000-000000000000"
)

// TestSubRequest: a prioritized list (firstAvailable) gives results named "<request>/<sub-request>".
// Over the kubelet protocol the devices are announced under the parent request (the helper
// strips the sub-request, and a container references the parent), the CDI device names carry
// "<request>_<sub-request>", the env and vgpu.config carry the chosen sub-request's limits, NRI
// checks name the sub-request, and the container registers.
func TestSubRequest(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	n := newNode(t)
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu/small", device: "gpu-1", memory: "10Gi", cores: 20, shareID: shareS1})
	resp := k.prepare(t, a)[string(a.UID)]
	if resp.Error != "" {
		t.Fatal(resp.Error)
	}
	if len(resp.Devices) != 1 || !slices.Equal(resp.Devices[0].RequestNames, []string{"gpu"}) {
		t.Fatalf("devices %v, want one device for the parent request gpu", resp.Devices)
	}
	ids := resp.Devices[0].CdiDeviceIds
	wantID := driverName + "/claim=" + string(a.UID) + "-gpu_small-gpu-1-" + shareS1[:8]
	if len(ids) == 0 || ids[0] != wantID {
		t.Fatalf("CDI devices %v, want %s first", ids, wantID)
	}
	_, device, _ := strings.Cut(ids[0], "=")
	env := n.readSpec(string(a.UID)).env(t, device)
	if env[contract.EnvMemLimitPfx+"1"] != "10240m" || env[contract.EnvCoreLimitPfx+"1"] != "20" {
		t.Errorf("env %v, want the sub-request's limits on GPU 1", env)
	}
	if got := n.readCheckpoint().Claims[string(a.UID)].Devices[0].Request; got != "gpu/small" {
		t.Errorf("checkpoint request %q, want gpu/small", got)
	}

	// The container references the parent request: the kubelet hands it the devices above.
	n.waitSession(1)
	ctx := t.Context()
	pod := podOf(a)
	if err := n.nri.runPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	adj, err := n.nri.create(ctx, pod.Id, n.vgpuContainer("ctr-1", "app", onlyDevices(resp, "gpu"), string(a.UID)))
	if err != nil {
		t.Fatal(err)
	}
	in, _ := n.plugin.NRICache().Lookup(pod.Uid, "app")
	gpus := n.gpuList(t)
	want := contract.ContainerConfig{ClaimUID: string(a.UID), PodUID: pod.Uid, ContainerName: "app",
		GPUs: []contract.ContainerGPU{{Index: 1, UUID: gpus[1], MemoryBytes: 10 << 30, Cores: 20}}}
	if got := readContainerConfig(t, in.ConfigDir); !reflect.DeepEqual(got, want) {
		t.Errorf("vgpu.config = %+v, want %+v", got, want)
	}

	// NRI's one-running-container rule names the sub-request.
	second := n.vgpuContainer("ctr-2", "other", onlyDevices(resp, "gpu"), string(a.UID))
	if _, err := n.nri.create(ctx, pod.Id, second); err == nil || !strings.Contains(err.Error(), `request "gpu/small"`) {
		t.Errorf("a second name on the result: %v, want an error naming request gpu/small", err)
	}

	// The container registers under the identity NRI gave it.
	req := registry.Request{ClientVersion: "integration"}
	for _, e := range adj.GetEnv() {
		switch e.Key {
		case contract.EnvPodUID:
			req.PodUID = e.Value
		case contract.EnvContainerName:
			req.ContainerName = e.Value
		}
	}
	cg := rt.NewCgroup(t, h)
	initProc := rt.StartChild(t, cg, rt.Spec{})
	if err := n.nri.start(ctx, "ctr-1", uint32(initProc.PID)); err != nil {
		t.Fatal(err)
	}
	app := rt.StartChild(t, cg, rt.Spec{Socket: filepath.Join(n.cfg.StateDir, "registry", "registry.sock"), Count: 1, Request: req})
	if rep := app.Report(t); rep.Statuses[0] != "OK" {
		t.Fatalf("registration: %s %s", rep.Statuses[0], rep.Messages[0])
	}
}

// TestSubRequestsOfOneClaimOnTwoGPUs: a claim whose two requests each chose a sub-request gets a
// CDI device per result, and a container referencing one parent request only its GPU.
func TestSubRequestsOfOneClaimOnTwoGPUs(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	a := n.newClaim("a",
		allocated{request: "train/big", device: "gpu-0", memory: "40Gi", cores: 50, shareID: shareS1},
		allocated{request: "infer/small", device: "gpu-1", memory: "4Gi", cores: 10, shareID: shareS2})
	resp := k.prepare(t, a)[string(a.UID)]
	if resp.Error != "" {
		t.Fatal(resp.Error)
	}
	n.waitSession(1)
	ctx := t.Context()
	pod := podOf(a)
	if err := n.nri.runPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := n.nri.create(ctx, pod.Id, n.vgpuContainer("ctr-i", "infer", onlyDevices(resp, "infer"), string(a.UID))); err != nil {
		t.Fatal(err)
	}
	in, _ := n.plugin.NRICache().Lookup(pod.Uid, "infer")
	got := readContainerConfig(t, in.ConfigDir)
	if len(got.GPUs) != 1 || got.GPUs[0].Index != 1 || got.GPUs[0].MemoryBytes != 4<<30 || got.GPUs[0].Cores != 10 {
		t.Errorf("vgpu.config GPUs %+v, want GPU 1 with infer/small's 4Gi and 10 cores only", got.GPUs)
	}
}
