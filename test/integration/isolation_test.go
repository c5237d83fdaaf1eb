package integration

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
)

const (
	shareI1 = "15013001-0000-4000-8000-000000000000"
	shareI2 = "15013002-0000-4000-8000-000000000000"
)

// readContainerConfig reads vgpu.config from a host config directory as the library would.
func readContainerConfig(t *testing.T, configDir string) contract.ContainerConfig {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(configDir, contract.ContainerConfigName))
	if err != nil {
		t.Fatalf("read %s: %v", contract.ContainerConfigName, err)
	}
	c, err := contract.ParseContainerConfig(data)
	if err != nil {
		t.Fatalf("%s does not parse: %v\n%s", contract.ContainerConfigName, err, data)
	}
	return c
}

// onlyDevices keeps the CDI devices of a Prepare response that belong to one request (the
// kubelet gives a container the devices of the requests it references).
func onlyDevices(resp *drapb.NodePrepareResourceResponse, request string) *drapb.NodePrepareResourceResponse {
	out := &drapb.NodePrepareResourceResponse{}
	for _, d := range resp.Devices {
		if len(d.RequestNames) == 1 && d.RequestNames[0] == request {
			out.Devices = append(out.Devices, d)
		}
	}
	return out
}

func isTmpfs(t *testing.T, path string) bool {
	t.Helper()
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		t.Fatalf("statfs %s: %v", path, err)
	}
	return sfs.Type == unix.TMPFS_MAGIC
}

// TestContainerConfigNRIPath: a container of a two-GPU claim that references one request gets a
// vgpu.config with that request's GPU and limits only, and its identity; the claim's directory
// is a tmpfs of its own until Unprepare.
func TestContainerConfigNRIPath(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	a := n.newClaim("a",
		allocated{request: "small", device: "gpu-0", memory: "4Gi", cores: 30, shareID: shareI1},
		allocated{request: "big", device: "gpu-1", memory: "8Gi", shareID: shareI2})
	resp := k.prepare(t, a)[string(a.UID)]
	if resp.Error != "" {
		t.Fatal(resp.Error)
	}
	if !isTmpfs(t, n.claimDir(string(a.UID))) {
		t.Error("the claim directory is not on a tmpfs of its own")
	}
	n.waitSession(1)
	ctx := t.Context()
	pod := podOf(a)
	if err := n.nri.runPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := n.nri.create(ctx, pod.Id, n.vgpuContainer("ctr-small", "small", onlyDevices(resp, "small"), string(a.UID))); err != nil {
		t.Fatal(err)
	}
	in, _ := n.plugin.NRICache().Lookup(pod.Uid, "small")
	got := readContainerConfig(t, in.ConfigDir)
	gpus := n.gpuList(t)
	want := contract.ContainerConfig{ClaimUID: string(a.UID), PodUID: pod.Uid, ContainerName: "small",
		GPUs: []contract.ContainerGPU{{Index: 0, UUID: gpus[0], MemoryBytes: 4 << 30, Cores: 30}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("vgpu.config = %+v, want %+v", got, want)
	}

	k.unprepare(t, a)
	if m := mountsUnder(t, n.cfg.StateDir); len(m) != 0 {
		t.Errorf("mounts left under the state dir after Unprepare: %v", m)
	}
}

// TestContainerConfigPerClaimPath: on the per-claim path the claim's one config names every GPU
// of the claim and the register UUID, and nothing about a pod.
func TestContainerConfigPerClaimPath(t *testing.T) {
	n := newNode(t, func(c *plugin.Config) { c.NRI = false })
	n.start()
	k := n.register()
	a := n.newClaim("a",
		allocated{request: "x", device: "gpu-0", memory: "4Gi", cores: 30, shareID: shareI1},
		allocated{request: "y", device: "gpu-1", shareID: shareI2})
	if r := k.prepare(t, a)[string(a.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	got := readContainerConfig(t, filepath.Join(n.claimDir(string(a.UID)), "claim", "config"))
	gpus := n.gpuList(t)
	want := contract.ContainerConfig{ClaimUID: string(a.UID), RegisterUUID: n.readCheckpoint().Claims[string(a.UID)].RegisterUUID,
		GPUs: []contract.ContainerGPU{{Index: 0, UUID: gpus[0], MemoryBytes: 4 << 30, Cores: 30}, {Index: 1, UUID: gpus[1]}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("vgpu.config = %+v, want %+v", got, want)
	}
}

// TestEnvInjectionGivesOnlyReferencedGPUs: with --gpu-injection=env a container sees the GPUs
// of the requests it references and no other: each result's CDI device names its own GPU, the
// claim-common device none, and the NRI plugin sets the exact list for a container of several
// results. Without NRI a claim of several GPUs is refused, saying which mode to use.
func TestEnvInjectionGivesOnlyReferencedGPUs(t *testing.T) {
	n := newNode(t, func(c *plugin.Config) { c.GPUInjection = cdi.InjectionEnv })
	n.start()
	k := n.register()
	a := n.newClaim("a",
		allocated{request: "x", device: "gpu-0", memory: "4Gi", shareID: shareI1},
		allocated{request: "y", device: "gpu-1", memory: "4Gi", shareID: shareI2})
	resp := k.prepare(t, a)[string(a.UID)]
	if resp.Error != "" {
		t.Fatal(resp.Error)
	}
	gpus := n.gpuList(t)
	spec := n.readSpec(string(a.UID))
	if v, ok := spec.env(t, string(a.UID)+"-common")[contract.EnvNvidiaVisible]; ok {
		t.Errorf("the claim-common device sets %s=%q: every container of the claim would see every GPU", contract.EnvNvidiaVisible, v)
	}
	n.waitSession(1)
	ctx := t.Context()
	pod := podOf(a)
	if err := n.nri.runPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		resp *drapb.NodePrepareResourceResponse
		want string
	}{
		{"only-x", onlyDevices(resp, "x"), gpus[0]},
		{"only-y", onlyDevices(resp, "y"), gpus[1]},
		{"both", resp, gpus[0] + "," + gpus[1]},
	} {
		ctr := n.vgpuContainer("ctr-"+tc.name, tc.name, tc.resp, string(a.UID))
		adj, err := n.nri.create(ctx, pod.Id, ctr)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := effectiveEnv(ctr, adj)[contract.EnvNvidiaVisible]; got != tc.want {
			t.Errorf("container %s sees %s=%q, want %q", tc.name, contract.EnvNvidiaVisible, got, tc.want)
		}
		// One running container per result (contract §3): this one goes before the next.
		if err := n.nri.stop(ctx, ctr.Id); err != nil {
			t.Fatal(err)
		}
		if err := n.nri.remove(ctx, ctr.Id); err != nil {
			t.Fatal(err)
		}
	}

	perClaim := newNode(t, func(c *plugin.Config) { c.GPUInjection = cdi.InjectionEnv; c.NRI = false })
	perClaim.start()
	pk := perClaim.register()
	b := perClaim.newClaim("b",
		allocated{request: "x", device: "gpu-0", memory: "4Gi", shareID: shareI1},
		allocated{request: "y", device: "gpu-1", memory: "4Gi", shareID: shareI2})
	r := pk.prepare(t, b)[string(b.UID)]
	if !strings.Contains(r.Error, "--gpu-injection=cdi") {
		t.Errorf("per-claim path, env injection, two GPUs: %q, want a refusal naming --gpu-injection=cdi", r.Error)
	}
	one := perClaim.newClaim("one", allocated{request: "x", device: "gpu-0", memory: "4Gi", shareID: shareI1})
	if r := pk.prepare(t, one)[string(one.UID)]; r.Error != "" {
		t.Errorf("per-claim path, env injection, one GPU: %s", r.Error)
	}
	if got := perClaim.readSpec(string(one.UID)).env(t, string(one.UID)+"-x-gpu-0-15013001")[contract.EnvNvidiaVisible]; got != gpus[0] {
		t.Errorf("one-GPU claim: %s=%q on its result device, want %q", contract.EnvNvidiaVisible, got, gpus[0])
	}
}

// effectiveEnv is the container's env after NRI's adjustment, as the runtime applies it.
func effectiveEnv(ctr *api.Container, adj *api.ContainerAdjustment) map[string]string {
	env := map[string]string{}
	for _, kv := range ctr.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for _, e := range adj.GetEnv() {
		env[e.Key] = e.Value
	}
	return env
}

// gpuList is the node's simulated GPU UUIDs by index.
func (n *node) gpuList(t *testing.T) []string {
	t.Helper()
	devs, err := n.gpus.Devices(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(devs))
	for i, d := range devs {
		out[i] = d.UUID
	}
	return out
}
