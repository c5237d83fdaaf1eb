package cdi

import (
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

const (
	share0 = gpu0UUID + "::0"
	share1 = gpu0UUID + "::1"
)

func shareDirs(uid string) PerClaimDirs {
	root := stateDir + "/claims/" + uid + "/claim"
	return PerClaimDirs{Config: root + "/config", VGPULock: root + "/vgpu_lock", VMemNode: root + "/vmem_node"}
}

func dirMounts(d PerClaimDirs) []cdispec.Mount {
	ro, rw := []string{"ro", "nosuid", "nodev", "bind"}, []string{"rw", "nosuid", "nodev", "bind"}
	return []cdispec.Mount{
		{HostPath: d.Config, ContainerPath: "/etc/vgpu-dra/config", Options: ro, Type: "bind"},
		{HostPath: d.VGPULock, ContainerPath: "/tmp/.vgpu_lock", Options: rw, Type: "bind"},
		{HostPath: d.VMemNode, ContainerPath: "/tmp/.vmem_node", Options: rw, Type: "bind"},
	}
}

// TestWriteShares: one spec, kind <driver>/share, one device per share named by its device ID,
// each mounting the library, the registry and that share's own directory set — and no env (a
// container's limits depend on which shares it holds). The runtime's CDI cache resolves the
// qualified IDs that Allocate answers.
func TestWriteShares(t *testing.T) {
	for _, installed := range []bool{true, false} {
		t.Run(map[bool]string{true: "library installed", false: "no library"}[installed], func(t *testing.T) {
			w := newTestWriter(t, func(o *Options) { o.LibraryInstalled = installed })
			shares := []Share{{ID: share0, Dirs: shareDirs(claimUID)}, {ID: share1, Dirs: shareDirs(claimUID2)}}
			if err := w.WriteShares(shares); err != nil {
				t.Fatal(err)
			}
			spec, err := cdiapi.ReadSpec(w.SharesSpecPath(), 0)
			if err != nil {
				t.Fatalf("the CDI loader refuses the spec: %v", err)
			}
			if spec.Kind != testDriver+"/share" {
				t.Errorf("kind %q", spec.Kind)
			}
			if len(spec.Devices) != 2 {
				t.Fatalf("%d devices, want 2", len(spec.Devices))
			}
			for i, sh := range shares {
				d := spec.Devices[i]
				want := slices.Concat(registryMount, dirMounts(sh.Dirs))
				if installed {
					want = slices.Concat(libMounts, want)
				}
				if d.Name != sh.ID || len(d.ContainerEdits.Env) != 0 || !equalMounts(d.ContainerEdits.Mounts, want) {
					t.Errorf("device %d: name %q env %v mounts %v; want %q, no env, mounts %v", i, d.Name, d.ContainerEdits.Env, d.ContainerEdits.Mounts, sh.ID, want)
				}
			}
			cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(w.opts.SpecDir), cdiapi.WithAutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			if dev := cache.GetDevice(w.ShareDeviceID(share1)); dev == nil {
				t.Errorf("the runtime's cache does not resolve %s", w.ShareDeviceID(share1))
			}
		})
	}
}

func equalMounts(got []*cdispec.Mount, want []cdispec.Mount) bool {
	return slices.EqualFunc(got, want, func(g *cdispec.Mount, w cdispec.Mount) bool {
		return g.HostPath == w.HostPath && g.ContainerPath == w.ContainerPath && g.Type == w.Type && slices.Equal(g.Options, w.Options)
	})
}

// TestWriteSharesKeepsCurrent: an unchanged set is not rewritten (the runtime's cache is not
// woken), a changed one replaces the file, an empty one removes it.
func TestWriteSharesKeepsCurrent(t *testing.T) {
	w := newTestWriter(t, nil)
	one := []Share{{ID: share0, Dirs: shareDirs(claimUID)}}
	if err := w.WriteShares(one); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(w.SharesSpecPath())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteShares(one); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(w.SharesSpecPath()); !os.SameFile(before, after) {
		t.Error("an unchanged spec was rewritten")
	}
	if err := w.WriteShares(append(one, Share{ID: share1, Dirs: shareDirs(claimUID2)})); err != nil {
		t.Fatal(err)
	}
	if spec, err := cdiapi.ReadSpec(w.SharesSpecPath(), 0); err != nil || len(spec.Devices) != 2 {
		t.Fatalf("after adding a share: %v devices, %v", spec, err)
	}
	if err := w.WriteShares(nil); err != nil {
		t.Fatal(err)
	}
	if names := specFiles(t, w.opts.SpecDir); len(names) != 0 {
		t.Errorf("no shares left %v in the spec dir", names)
	}
}

func TestWriteSharesRefuses(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Options)
		shares []Share
	}{
		{"name CDI refuses", nil, []Share{{ID: "GPU 0::0", Dirs: shareDirs(claimUID)}}},
		{"two shares of one ID", nil, []Share{{ID: share0, Dirs: shareDirs(claimUID)}, {ID: share0, Dirs: shareDirs(claimUID2)}}},
		{"relative directory", nil, []Share{{ID: share0, Dirs: PerClaimDirs{Config: "config", VGPULock: "/a", VMemNode: "/b"}}}},
		{"VGPU off", func(o *Options) { o.VGPU = false }, []Share{{ID: share0, Dirs: shareDirs(claimUID)}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newTestWriter(t, tc.mutate)
			if err := w.WriteShares(tc.shares); !errors.Is(err, ErrInvalidShare) {
				t.Fatalf("WriteShares = %v, want ErrInvalidShare", err)
			}
			if names := specFiles(t, w.opts.SpecDir); len(names) != 0 {
				t.Errorf("refused shares left %v", names)
			}
		})
	}
}

func TestShareAndGPUDeviceIDs(t *testing.T) {
	w := newTestWriter(t, nil)
	if got := w.ShareDeviceID(share1); got != "vgpu.dra.dev/share="+share1 {
		t.Errorf("ShareDeviceID = %q", got)
	}
	if got := w.GPUDeviceIDs([]string{gpu0UUID, gpu3UUID}); !slices.Equal(got, []string{"nvidia.com/gpu=" + gpu0UUID, "nvidia.com/gpu=" + gpu3UUID}) {
		t.Errorf("GPUDeviceIDs = %v", got)
	}
	for name, mutate := range map[string]func(*Options){
		"env injection": func(o *Options) { o.GPUInjection = InjectionEnv },
		"no GPU kind":   func(o *Options) { o.GPUCDIKind = "" },
	} {
		if got := newTestWriter(t, mutate).GPUDeviceIDs([]string{gpu0UUID}); got != nil {
			t.Errorf("%s: GPUDeviceIDs = %v, want none", name, got)
		}
	}
}

// TestEnv: the env a container of the claim gets, as a map: per-claim identity, every GPU's
// variables, all other indices neutralised; with env injection NVIDIA_VISIBLE_DEVICES names
// every GPU of the claim (CDI could hold only one per variable).
func TestEnv(t *testing.T) {
	pairs := func(kvs ...[]string) map[string]string {
		m := map[string]string{}
		for _, kv := range slices.Concat(kvs...) {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		return m
	}
	identity := []string{"MANAGER_VGPU_CLAIM_UID=", "MANAGER_CLIENT_REGISTER_UUID=" + registerUUID}
	gpu0 := []string{"CUDA_CORE_LIMIT_0=30", "CUDA_MEM_LIMIT_0=4096m", "MANAGER_VISIBLE_DEVICE_0=" + gpu0UUID}
	gpu3 := []string{"CUDA_CORE_LIMIT_3=", "CUDA_MEM_LIMIT_3=", "MANAGER_VISIBLE_DEVICE_3=" + gpu3UUID}
	tests := []struct {
		name   string
		mutate func(*Options)
		claim  Claim
		want   map[string]string
	}{
		{"one GPU", nil, perClaimClaim(gpu0Result()), pairs(identity, aggregatesEmpty, gpu0, neutralised(0))},
		{"two GPUs", nil, perClaimClaim(gpu0Result(), gpu3Result()), pairs(identity, aggregatesEmpty, gpu0, gpu3, neutralised(0, 3))},
		{"two GPUs, env injection", func(o *Options) { o.GPUInjection = InjectionEnv }, perClaimClaim(gpu0Result(), gpu3Result()),
			pairs(identity, aggregatesEmpty, gpu0, gpu3, neutralised(0, 3), []string{"NVIDIA_VISIBLE_DEVICES=" + gpu0UUID + "," + gpu3UUID})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := newTestWriter(t, tc.mutate).Env(tc.claim)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tc.want) {
				for k, v := range tc.want {
					if got[k] != v {
						t.Errorf("%s=%q, want %q", k, got[k], v)
					}
				}
				t.Errorf("%d variables, want %d", len(got), len(tc.want))
			}
		})
	}
	if _, err := newTestWriter(t, nil).Env(Claim{UID: claimUID, Path: contract.PathPerClaim}); !errors.Is(err, ErrInvalidClaim) {
		t.Errorf("Env of an invalid claim: %v, want ErrInvalidClaim", err)
	}
}
