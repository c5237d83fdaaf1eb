package deviceplugin

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// TestAllocation: validation of the kubelet's device IDs, and two shares of one GPU in one
// container merged into one vgpu.config line with the summed limits.
func TestAllocation(t *testing.T) {
	inv, err := NewInventory(testGPUs(3, 80*gib), Sizing{SharesPerGPU: 4, ShareCores: 30}, resource)
	if err != nil {
		t.Fatal(err)
	}
	unhealthy := func(uuid string) (bool, string) { return uuid != inv.GPUs[2].Device.UUID, "XID 79" }
	gpuLine := func(g int, k int64, cores int64) contract.ContainerGPU {
		return contract.ContainerGPU{Index: g, UUID: inv.GPUs[g].Device.UUID, MemoryBytes: k * 20 * gib, Cores: cores}
	}
	tests := []struct {
		name    string
		ids     []string
		lead    string
		gpus    []contract.ContainerGPU
		wantErr error
	}{
		{"one share", ids([2]int{1, 2}), id(1, 2), []contract.ContainerGPU{gpuLine(1, 1, 30)}, nil},
		{"two of one GPU merge", ids([2]int{1, 3}, [2]int{1, 0}), id(1, 0), []contract.ContainerGPU{gpuLine(1, 2, 60)}, nil},
		{"four of one GPU: cores unlimited", ids([2]int{0, 0}, [2]int{0, 1}, [2]int{0, 2}, [2]int{0, 3}), id(0, 0), []contract.ContainerGPU{gpuLine(0, 4, 0)}, nil},
		{"two GPUs, lead on the lower", ids([2]int{1, 1}, [2]int{0, 2}, [2]int{1, 2}), id(0, 2),
			[]contract.ContainerGPU{gpuLine(0, 1, 30), gpuLine(1, 2, 60)}, nil},
		{"none", nil, "", nil, ErrNoShares},
		{"unknown", []string{"GPU-x::0"}, "", nil, ErrUnknownShare},
		{"past the count", ids([2]int{0, 4}), "", nil, ErrUnknownShare},
		{"twice", ids([2]int{0, 1}, [2]int{0, 1}), "", nil, ErrDuplicateShare},
		{"unhealthy GPU", ids([2]int{0, 1}, [2]int{2, 0}), "", nil, ErrUnhealthyShare},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			al, err := inv.allocation(tc.ids, unhealthy)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				if len(tc.ids) > 0 && !containsAny(err.Error(), tc.ids) {
					t.Errorf("error %q names none of the IDs", err)
				}
				return
			}
			if al.lead.ID != tc.lead || !slices.Equal(al.gpus, tc.gpus) {
				t.Errorf("lead %s gpus %+v\nwant %s %+v", al.lead.ID, al.gpus, tc.lead, tc.gpus)
			}
		})
	}
}

func containsAny(s string, subs []string) bool {
	return slices.ContainsFunc(subs, func(sub string) bool { return sub != "" && strings.Contains(s, sub) })
}

// newTestAllocator allocates into a temporary state dir (its share directories on a tmpfs of
// fsBytes each, 0: none) with a CDI writer like production's.
func newTestAllocator(t *testing.T, inv *Inventory, fsBytes int64, injection cdi.Injection) (*allocator, claimdir.Layout) {
	t.Helper()
	state := t.TempDir()
	layout := claimdir.Layout{StateDir: state, ClaimFSBytes: fsBytes}
	w, err := cdi.NewWriter(cdi.Options{DriverName: "vgpu.dra.dev", SpecDir: filepath.Join(state, "cdi"),
		RegistryDir: layout.RegistryDir(), VGPU: true, GPUInjection: injection, GPUCDIKind: contract.DefaultGPUCDIKind})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, sh := range inv.Shares {
			_ = layout.RemoveClaim(sh.UID) // unmounts the tmpfs
		}
	})
	return newAllocator(inv, layout, w, nil, time.Now), layout
}

// TestAllocate: the lead's directory set holds the container's vgpu.config (read back with the
// library's rules), the answer names the lead's CDI device and the GPUs' own, and the env is
// contract §3's with the merged limits.
func TestAllocate(t *testing.T) {
	inv := testInventory(t, 2, 4)
	a, layout := newTestAllocator(t, inv, 0, cdi.InjectionCDI)
	resp, err := a.allocate(ids([2]int{1, 3}, [2]int{0, 1}, [2]int{1, 2}))
	if err != nil {
		t.Fatal(err)
	}
	lead := inv.byID[id(0, 1)]
	dirs, _ := layout.PerClaimDirs(lead.UID)
	data, err := os.ReadFile(filepath.Join(dirs.Config, contract.ContainerConfigName))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := contract.ParseContainerConfig(data)
	if err != nil {
		t.Fatalf("vgpu.config refused by the library's rules: %v\n%s", err, data)
	}
	want := contract.ContainerConfig{ClaimUID: lead.UID, RegisterUUID: lead.UID, GPUs: []contract.ContainerGPU{
		{Index: 0, UUID: inv.GPUs[0].Device.UUID, MemoryBytes: 20 * gib},
		{Index: 1, UUID: inv.GPUs[1].Device.UUID, MemoryBytes: 40 * gib},
	}}
	if cfg.ClaimUID != want.ClaimUID || cfg.RegisterUUID != want.RegisterUUID || !slices.Equal(cfg.GPUs, want.GPUs) {
		t.Errorf("vgpu.config = %+v\nwant %+v", cfg, want)
	}
	var cdiIDs []string
	for _, d := range resp.CdiDevices {
		cdiIDs = append(cdiIDs, d.Name)
	}
	if want := []string{"vgpu.dra.dev/share=" + lead.ID, "nvidia.com/gpu=" + inv.GPUs[0].Device.UUID, "nvidia.com/gpu=" + inv.GPUs[1].Device.UUID}; !slices.Equal(cdiIDs, want) {
		t.Errorf("CDI devices %v, want %v", cdiIDs, want)
	}
	for k, v := range map[string]string{
		"MANAGER_CLIENT_REGISTER_UUID": lead.UID, "MANAGER_VGPU_CLAIM_UID": "",
		"CUDA_MEM_LIMIT_0": "20480m", "CUDA_MEM_LIMIT_1": "40960m", "CUDA_CORE_LIMIT_1": "",
		"MANAGER_VISIBLE_DEVICE_1": inv.GPUs[1].Device.UUID, "MANAGER_VISIBLE_DEVICE_2": "", "CUDA_MEM_LIMIT_2": "",
	} {
		if got, ok := resp.Envs[k]; !ok || got != v {
			t.Errorf("env %s=%q (set %v), want %q", k, got, ok, v)
		}
	}
	if _, ok := resp.Envs["NVIDIA_VISIBLE_DEVICES"]; ok {
		t.Error("NVIDIA_VISIBLE_DEVICES set with CDI injection")
	}
}

// TestAllocateResetsTheLeadsDirectories: a share's next holder gets a fresh tmpfs — nothing
// the last holder wrote or planted in its writable directories (a full file system, a fake
// ledger, a symlink) is there — while the last holder's own mount keeps its view.
func TestAllocateResetsTheLeadsDirectories(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts a tmpfs per share and needs root")
	}
	inv := testInventory(t, 1, 2)
	a, layout := newTestAllocator(t, inv, 1<<20, cdi.InjectionNone)
	if _, err := a.allocate(ids([2]int{0, 0})); err != nil {
		t.Fatal(err)
	}
	dirs, _ := layout.PerClaimDirs(inv.byID[id(0, 0)].UID)
	planted := filepath.Join(dirs.VMemNode, "ledger.v2")
	if err := os.WriteFile(planted, make([]byte, 900<<10), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/shadow", filepath.Join(dirs.VGPULock, "core.v3")); err != nil {
		t.Fatal(err)
	}
	var before unix.Statfs_t
	if err := unix.Statfs(dirs.VMemNode, &before); err != nil || before.Type != unix.TMPFS_MAGIC {
		t.Fatalf("the share's directories are not on a tmpfs: %v", err)
	}
	if _, err := a.allocate(ids([2]int{0, 0})); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{planted, filepath.Join(dirs.VGPULock, "core.v3")} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s survived the next Allocate: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dirs.Config, contract.ContainerConfigName)); err != nil {
		t.Errorf("vgpu.config after the reset: %v", err)
	}
	if a.allocated[inv.byID[id(0, 0)].UID].IsZero() {
		t.Error("the allocation's time is not recorded for the keeper")
	}
}

// TestAllocateEnvInjection: with env injection NVIDIA_VISIBLE_DEVICES lists the container's
// GPUs and no GPU CDI device is answered.
func TestAllocateEnvInjection(t *testing.T) {
	inv := testInventory(t, 2, 2)
	a, _ := newTestAllocator(t, inv, 0, cdi.InjectionEnv)
	resp, err := a.allocate(ids([2]int{1, 0}, [2]int{0, 0}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.Envs["NVIDIA_VISIBLE_DEVICES"], inv.GPUs[0].Device.UUID+","+inv.GPUs[1].Device.UUID; got != want {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %q", got, want)
	}
	if len(resp.CdiDevices) != 1 {
		t.Errorf("CDI devices %v, want the share's alone", resp.CdiDevices)
	}
}
