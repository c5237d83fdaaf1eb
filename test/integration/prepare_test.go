package integration

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	shareA = "5a4e0001-0000-4000-8000-000000000001"
	shareB = "5a4e0002-0000-4000-8000-000000000002"
	shareC = "5a4e0003-0000-4000-8000-000000000003"
)

// TestPrepareSharedAndMultiGPUClaims: two claims share gpu-0 with limits; a third spans gpu-1
// (whole) and a slice of gpu-0. Everything a container would get is checked on disk.
func TestPrepareSharedAndMultiGPUClaims(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	devs, _ := n.gpus.Devices(t.Context())
	gpu0, gpu1 := devs[0].UUID, devs[1].UUID

	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "10Gi", cores: 30, shareID: shareA})
	b := n.newClaim("b", allocated{request: "gpu", device: "gpu-0", memory: "10Gi", cores: 30, shareID: shareB})
	c := n.newClaim("c",
		allocated{request: "big", device: "gpu-1"},
		allocated{request: "small", device: "gpu-0", memory: "8Gi", cores: 20, shareID: shareC})
	resp := k.prepare(t, a, b, c)

	for _, cl := range []struct {
		uid  string
		want [][]string
	}{
		{string(a.UID), [][]string{{driverName + "/claim=" + string(a.UID) + "-gpu-gpu-0-5a4e0001", driverName + "/claim=" + string(a.UID) + "-common"}}},
		{string(c.UID), [][]string{
			{driverName + "/claim=" + string(c.UID) + "-big-gpu-1", driverName + "/claim=" + string(c.UID) + "-common"},
			{driverName + "/claim=" + string(c.UID) + "-small-gpu-0-5a4e0003", driverName + "/claim=" + string(c.UID) + "-common"},
		}},
	} {
		r := resp[cl.uid]
		if r == nil || r.Error != "" {
			t.Fatalf("claim %s: response %v", cl.uid, r)
		}
		if len(r.Devices) != len(cl.want) {
			t.Fatalf("claim %s: %d devices, want %d", cl.uid, len(r.Devices), len(cl.want))
		}
		for i, d := range r.Devices {
			if !slices.Equal(d.CdiDeviceIds, cl.want[i]) {
				t.Errorf("claim %s device %d CDI IDs = %v, want %v", cl.uid, i, d.CdiDeviceIds, cl.want[i])
			}
			if d.PoolName != nodeName {
				t.Errorf("pool = %q", d.PoolName)
			}
		}
	}
	if got := resp[string(a.UID)].Devices[0].GetShareId(); got != shareA {
		t.Errorf("share ID = %q, want %q", got, shareA)
	}

	// Claim a: limits on index 0, identity, neutralised other indices.
	spec := n.readSpec(string(a.UID))
	if spec.Kind != driverName+"/claim" {
		t.Errorf("kind = %q", spec.Kind)
	}
	env := spec.env(t, string(a.UID)+"-gpu-gpu-0-5a4e0001")
	wantEnv(t, env, map[string]string{"MANAGER_VISIBLE_DEVICE_0": gpu0, "CUDA_MEM_LIMIT_0": "10240m", "CUDA_CORE_LIMIT_0": "30"})
	common := spec.env(t, string(a.UID)+"-common")
	wantEnv(t, common, map[string]string{
		"MANAGER_VGPU_CLAIM_UID": string(a.UID), "MANAGER_CLIENT_REGISTER_UUID": "",
		"MANAGER_VISIBLE_DEVICE_1": "", "CUDA_MEM_LIMIT_1": "", "CUDA_CORE_LIMIT_15": "",
		"MANAGER_VISIBLE_DEVICES": "", "CUDA_MEM_LIMIT": "", "CUDA_CORE_LIMIT": "",
	})
	if _, ok := common["MANAGER_VISIBLE_DEVICE_0"]; ok {
		t.Errorf("common device neutralises index 0, which the claim uses")
	}
	if got := spec.mounts(t, string(a.UID)+"-common")[contract.ContainerRegistryDir]; got != n.cfg.StateDir+"/registry" {
		t.Errorf("registry mount from %q", got)
	}
	if _, ok := spec.mounts(t, string(a.UID)+"-common")[contract.ContainerPreloadPath]; ok {
		t.Errorf("ld.so.preload mounted although the library is not installed")
	}

	// Claim c: whole gpu-1 is unlimited, the gpu-0 slice limited.
	spec = n.readSpec(string(c.UID))
	wantEnv(t, spec.env(t, string(c.UID)+"-big-gpu-1"), map[string]string{"MANAGER_VISIBLE_DEVICE_1": gpu1, "CUDA_MEM_LIMIT_1": "", "CUDA_CORE_LIMIT_1": ""})
	wantEnv(t, spec.env(t, string(c.UID)+"-small-gpu-0-5a4e0003"), map[string]string{"MANAGER_VISIBLE_DEVICE_0": gpu0, "CUDA_MEM_LIMIT_0": "8192m", "CUDA_CORE_LIMIT_0": "20"})

	// Directories and checkpoint.
	for _, cl := range []string{string(a.UID), string(b.UID), string(c.UID)} {
		st, err := os.Stat(n.claimDir(cl))
		if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Errorf("claim dir %s: %v %v", cl, st, err)
		}
	}
	cp := n.readCheckpoint()
	if cp.BootID != "boot-1" {
		t.Errorf("checkpoint bootID = %q", cp.BootID)
	}
	got := cp.Claims[string(c.UID)]
	if got.State != checkpoint.PrepareCompleted || got.Path != contract.PathNRI || got.Name != "c" || got.Namespace != "default" {
		t.Errorf("checkpoint entry of c = %+v", got)
	}
	if len(got.Devices) != 2 || got.Devices[1].MemoryBytes != 8<<30 || got.Devices[1].Cores != 20 || got.Devices[0].MemoryBytes != 0 || got.Devices[1].ShareID != shareC || got.Devices[1].GPUUUID != gpu0 {
		t.Errorf("checkpoint devices of c = %+v", got.Devices)
	}
	if !slices.Equal(got.ReservedFor, []string{string(c.Status.ReservedFor[0].UID)}) {
		t.Errorf("reservedFor = %v", got.ReservedFor)
	}

	k.unprepare(t, a, b, c)
	n.settle()
	for _, cl := range []string{string(a.UID), string(b.UID), string(c.UID)} {
		if exists(n.specPath(cl)) || exists(n.claimDir(cl)) {
			t.Errorf("claim %s: spec or directory left after unprepare", cl)
		}
	}
	if left := n.readCheckpoint().Claims; len(left) != 0 {
		t.Errorf("checkpoint still holds %d claims", len(left))
	}
	// Unprepare is idempotent.
	k.unprepare(t, a)
}

func wantEnv(t *testing.T, env map[string]string, want map[string]string) {
	t.Helper()
	for k, v := range want {
		got, ok := env[k]
		if !ok {
			t.Errorf("env %s missing (want %q)", k, v)
		} else if got != v {
			t.Errorf("env %s = %q, want %q", k, got, v)
		}
	}
}

// TestPrepareRefusesBadAllocations: every refusal names the claim and the device.
func TestPrepareRefusesBadAllocations(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	cases := []struct {
		name   string
		result allocated
		want   []string
	}{
		{"unknown-device", allocated{request: "gpu", device: "gpu-7", memory: "1Gi", cores: 10}, []string{"gpu-7", "not a GPU"}},
		{"other-node", allocated{request: "gpu", device: "gpu-0", pool: "node-2", memory: "1Gi", cores: 10}, []string{"gpu-0", "node-2", "not on this node"}},
		{"odd-memory", allocated{request: "gpu", device: "gpu-0", memory: "1000000", cores: 10}, []string{"gpu-0", "1Mi"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cl := n.newClaim(tc.name, tc.result)
			r := k.prepare(t, cl)[string(cl.UID)]
			if r == nil || r.Error == "" {
				t.Fatalf("claim was prepared: %v", r)
			}
			for _, w := range append(tc.want, "default/"+tc.name) {
				if !strings.Contains(r.Error, w) {
					t.Errorf("error %q does not mention %q", r.Error, w)
				}
			}
			if exists(n.specPath(string(cl.UID))) || exists(n.claimDir(string(cl.UID))) {
				t.Error("a refused claim left files behind")
			}
		})
	}

	t.Run("other-driver-only", func(t *testing.T) {
		cl := n.newClaim("foreign", allocated{request: "nic", device: "eth0", driver: "net.example.com"})
		r := k.prepare(t, cl)[string(cl.UID)]
		if r == nil || r.Error != "" || len(r.Devices) != 0 {
			t.Errorf("a claim with only another driver's results: %v, want no devices and no error", r)
		}
	})

	t.Run("missing-claim", func(t *testing.T) {
		cl := n.newClaim("gone", allocated{request: "gpu", device: "gpu-0", memory: "1Gi", cores: 10})
		if err := n.kube.ResourceV1().ResourceClaims("default").Delete(t.Context(), "gone", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		_, err := k.tryPrepare(cl)
		if err == nil || !strings.Contains(err.Error(), "default/gone") {
			t.Errorf("prepare of a deleted claim: err = %v, want one naming default/gone", err)
		}
	})

	t.Run("overcommit", func(t *testing.T) {
		x := n.newClaim("x", allocated{request: "gpu", device: "gpu-1", memory: "100Gi", cores: 60, shareID: shareA})
		y := n.newClaim("y", allocated{request: "gpu", device: "gpu-1", memory: "100Gi", cores: 30, shareID: shareB})
		resp := k.prepare(t, x)
		if resp[string(x.UID)].Error != "" {
			t.Fatalf("first claim refused: %s", resp[string(x.UID)].Error)
		}
		r := k.prepare(t, y)[string(y.UID)]
		if r.Error == "" || !strings.Contains(r.Error, "overcommitted") || !strings.Contains(r.Error, "gpu-1") {
			t.Errorf("second claim past the GPU's memory: %q, want an overcommit error naming gpu-1", r.Error)
		}
		k.unprepare(t, x, y)
	})
	if got := counterValue(t, n, "vgpu_dra_prepare_errors_total", "reason", "invalid_claim"); got != float64(len(cases)) {
		t.Errorf("prepare_errors_total{reason=invalid_claim} = %v, want %d", got, len(cases))
	}
}

// TestPerClaimPath: with NRISupport off, Prepare mints a register UUID and mounts one
// directory set for the claim through CDI; two results on one GPU are refused.
func TestPerClaimPath(t *testing.T) {
	n := newNode(t, func(c *plugin.Config) { c.NRI = false })
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "4Gi", cores: 25, shareID: shareA})
	r := k.prepare(t, a)[string(a.UID)]
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	spec := n.readSpec(string(a.UID))
	common := spec.env(t, string(a.UID)+"-common")
	if common["MANAGER_VGPU_CLAIM_UID"] != "" {
		t.Errorf("MANAGER_VGPU_CLAIM_UID = %q on the per-claim path, want empty", common["MANAGER_VGPU_CLAIM_UID"])
	}
	uuid := common["MANAGER_CLIENT_REGISTER_UUID"]
	if len(uuid) != 36 || strings.ToLower(uuid) != uuid {
		t.Errorf("register UUID %q is not a canonical UUID", uuid)
	}
	cp := n.readCheckpoint().Claims[string(a.UID)]
	if cp.Path != contract.PathPerClaim || cp.RegisterUUID != uuid {
		t.Errorf("checkpoint path %q uuid %q, want per-claim %q", cp.Path, cp.RegisterUUID, uuid)
	}
	mounts := spec.mounts(t, string(a.UID)+"-common")
	dir := n.claimDir(string(a.UID)) + "/claim"
	for cpath, host := range map[string]string{contract.ContainerConfigDir: dir + "/config", contract.ContainerVGPULockDir: dir + "/vgpu_lock", contract.ContainerVMemNodeDir: dir + "/vmem_node"} {
		if mounts[cpath] != host {
			t.Errorf("mount %s from %q, want %q", cpath, mounts[cpath], host)
		}
		if !exists(host) {
			t.Errorf("per-claim dir %s missing", host)
		}
	}
	// A second Prepare keeps the UUID (the path never changes for a prepared claim).
	k.prepare(t, a)
	if again := n.readSpec(string(a.UID)).env(t, string(a.UID)+"-common")["MANAGER_CLIENT_REGISTER_UUID"]; again != uuid {
		t.Errorf("register UUID changed on a repeated Prepare: %q → %q", uuid, again)
	}

	two := n.newClaim("two",
		allocated{request: "one", device: "gpu-1", memory: "4Gi", cores: 10, shareID: shareB},
		allocated{request: "other", device: "gpu-1", memory: "4Gi", cores: 10, shareID: shareC})
	r = k.prepare(t, two)[string(two.UID)]
	if !strings.Contains(r.Error, "NRI path") || !strings.Contains(r.Error, "gpu-1") {
		t.Errorf("two results on one GPU on the per-claim path: %q, want an error that names gpu-1 and the NRI path", r.Error)
	}
}
