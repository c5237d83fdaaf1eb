package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

const (
	shareAdm1 = "ad000001-0000-4000-8000-000000000000"
	shareAdm2 = "ad000002-0000-4000-8000-000000000000"
)

// TestAdminAccess: an admin-access claim prepares on a GPU whose whole capacity another claim
// holds (it takes no share), its env and vgpu.config carry no limit, the checkpoint records it
// in format v2, and its container gets the read-only config directory and no ledger directories.
func TestAdminAccess(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	full := n.newClaim("full", allocated{request: "gpu", device: "gpu-0", shareID: shareAdm1})
	mon := n.newClaim("mon", allocated{request: "mon", device: "gpu-0", memory: "256Mi", cores: 1, shareID: shareAdm2, admin: true})
	if r := k.prepare(t, full)[string(full.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	resp := k.prepare(t, mon)[string(mon.UID)]
	if resp.Error != "" {
		t.Fatalf("admin-access claim on a GPU taken whole: %s", resp.Error)
	}

	spec := n.readSpec(string(mon.UID))
	_, device, _ := strings.Cut(resp.Devices[0].CdiDeviceIds[0], "=")
	env := spec.env(t, device)
	for _, k := range []string{contract.EnvMemLimitPfx + "0", contract.EnvCoreLimitPfx + "0"} {
		if v, ok := env[k]; !ok || v != "" {
			t.Errorf("%s=%q (set %v), want empty: no limit", k, v, ok)
		}
	}
	dev := n.readCheckpoint().Claims[string(mon.UID)].Devices[0]
	if !dev.AdminAccess || dev.MemoryBytes != 0 || dev.Cores != 0 {
		t.Errorf("checkpoint device %+v, want admin access without limits", dev)
	}
	var envelope struct{ Version string }
	raw, err := os.ReadFile(filepath.Join(n.cfg.KubeletDir, "plugins", driverName, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &envelope); err != nil || envelope.Version != checkpoint.VersionV2 {
		t.Errorf("checkpoint version %q (%v), want v2 while an admin-access claim is prepared", envelope.Version, err)
	}

	n.waitSession(1)
	ctx := t.Context()
	pod := podOf(mon)
	if err := n.nri.runPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	adj, err := n.nri.create(ctx, pod.Id, n.vgpuContainer("ctr-mon", "monitor", resp, string(mon.UID)))
	if err != nil {
		t.Fatal(err)
	}
	m := mountsOf(adj)
	if _, ok := m[contract.ContainerConfigDir]; !ok || len(m) != 1 {
		t.Errorf("mounts %v, want the config directory only", m)
	}
	in, _ := n.plugin.NRICache().Lookup(pod.Uid, "monitor")
	gpus := n.gpuList(t)
	want := contract.ContainerConfig{ClaimUID: string(mon.UID), PodUID: pod.Uid, ContainerName: "monitor",
		GPUs: []contract.ContainerGPU{{Index: 0, UUID: gpus[0]}}}
	if got := readContainerConfig(t, in.ConfigDir); !reflect.DeepEqual(got, want) {
		t.Errorf("vgpu.config = %+v, want %+v (no limits: pass-through)", got, want)
	}

	k.unprepare(t, mon)
	if err := json.Unmarshal(mustRead(t, filepath.Join(n.cfg.KubeletDir, "plugins", driverName, "checkpoint.json")), &envelope); err != nil || envelope.Version != checkpoint.VersionV1 {
		t.Errorf("checkpoint version %q (%v) once the admin-access claim is gone, want v1 (a rollback can read it)", envelope.Version, err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
