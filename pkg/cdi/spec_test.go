package cdi

import (
	"slices"
	"testing"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// wantDevice is one CDI device of the spec.
type wantDevice struct {
	name   string
	env    []string
	mounts []cdispec.Mount
}

var (
	libMounts = []cdispec.Mount{
		{HostPath: hostLibrary, ContainerPath: "/etc/vgpu-dra/lib/libvgpu.so", Options: []string{"ro", "nosuid", "nodev", "bind"}, Type: "bind"},
		{HostPath: hostPreload, ContainerPath: "/etc/ld.so.preload", Options: []string{"ro", "nosuid", "nodev", "bind"}, Type: "bind"},
	}
	registryMount = []cdispec.Mount{
		{HostPath: hostRegistry, ContainerPath: "/etc/vgpu-dra/registry", Options: []string{"ro", "nosuid", "nodev", "bind"}, Type: "bind"},
	}
	perClaimMounts = []cdispec.Mount{
		{HostPath: hostConfig, ContainerPath: "/etc/vgpu-dra/config", Options: []string{"ro", "nosuid", "nodev", "bind"}, Type: "bind"},
		{HostPath: hostVGPULock, ContainerPath: "/tmp/.vgpu_lock", Options: []string{"rw", "nosuid", "nodev", "bind"}, Type: "bind"},
		{HostPath: hostVMemNode, ContainerPath: "/tmp/.vmem_node", Options: []string{"rw", "nosuid", "nodev", "bind"}, Type: "bind"},
	}
	aggregatesEmpty = []string{"MANAGER_VISIBLE_DEVICES=", "CUDA_MEM_LIMIT=", "CUDA_CORE_LIMIT="}
)

func TestBuildSpec(t *testing.T) {
	gpu0Limited := []string{"CUDA_CORE_LIMIT_0=30", "CUDA_MEM_LIMIT_0=4096m", "MANAGER_VISIBLE_DEVICE_0=" + gpu0UUID}
	gpu3Unlimited := []string{"CUDA_CORE_LIMIT_3=", "CUDA_MEM_LIMIT_3=", "MANAGER_VISIBLE_DEVICE_3=" + gpu3UUID}
	nriIdentity := []string{"MANAGER_VGPU_CLAIM_UID=" + claimUID, "MANAGER_CLIENT_REGISTER_UUID="}
	noIdentity := []string{"MANAGER_VGPU_CLAIM_UID=", "MANAGER_CLIENT_REGISTER_UUID="}

	tests := []struct {
		name   string
		mutate func(*Options)
		claim  Claim
		want   []wantDevice
	}{
		{
			name:  "NRI path, one GPU, limited",
			claim: nriClaim(gpu0Result()),
			want: []wantDevice{
				{name: claimUID + "-gpu-gpu-0", env: gpu0Limited},
				{name: commonName, env: sorted(nriIdentity, aggregatesEmpty, neutralised(0)),
					mounts: slices.Concat(libMounts, registryMount)},
			},
		},
		{
			name:  "NRI path, two GPUs, limited and unlimited",
			claim: nriClaim(gpu0Result(), gpu3Result()),
			want: []wantDevice{
				{name: claimUID + "-gpu-gpu-0", env: gpu0Limited},
				{name: claimUID + "-gpu-gpu-3", env: gpu3Unlimited},
				{name: commonName, env: sorted(nriIdentity, aggregatesEmpty, neutralised(0, 3)),
					mounts: slices.Concat(libMounts, registryMount)},
			},
		},
		{
			name: "per-claim path: claim UID set empty, register UUID, per-claim dirs",
			claim: perClaimClaim(
				Result{Request: "train/big", Device: "gpu-0", ShareID: shareID, GPUIndex: 0, GPUUUID: gpu0UUID, MemoryBytes: 1 << 20, Cores: 99},
				gpu3Result(),
			),
			want: []wantDevice{
				{name: claimUID + "-train_big-gpu-0-a1b2c3d4",
					env: []string{"CUDA_CORE_LIMIT_0=99", "CUDA_MEM_LIMIT_0=1m", "MANAGER_VISIBLE_DEVICE_0=" + gpu0UUID}},
				{name: claimUID + "-gpu-gpu-3", env: gpu3Unlimited},
				{name: commonName,
					env:    sorted([]string{"MANAGER_VGPU_CLAIM_UID=", "MANAGER_CLIENT_REGISTER_UUID=" + registerUUID}, aggregatesEmpty, neutralised(0, 3)),
					mounts: slices.Concat(libMounts, registryMount, perClaimMounts)},
			},
		},
		{
			name:  "100 cores and 0 memory are unlimited (empty)",
			claim: nriClaim(Result{Request: "gpu", Device: "gpu-0", GPUUUID: gpu0UUID, Cores: 100}),
			want: []wantDevice{
				{name: claimUID + "-gpu-gpu-0", env: []string{"CUDA_CORE_LIMIT_0=", "CUDA_MEM_LIMIT_0=", "MANAGER_VISIBLE_DEVICE_0=" + gpu0UUID}},
				{name: commonName, env: sorted(nriIdentity, aggregatesEmpty, neutralised(0)),
					mounts: slices.Concat(libMounts, registryMount)},
			},
		},
		{
			name:   "env injection: each result's device names its own GPU, the common device none",
			mutate: func(o *Options) { o.GPUInjection = InjectionEnv },
			claim:  nriClaim(gpu3Result(), gpu0Result()),
			want: []wantDevice{
				{name: claimUID + "-gpu-gpu-3", env: append(slices.Clone(gpu3Unlimited), "NVIDIA_VISIBLE_DEVICES="+gpu3UUID)},
				{name: claimUID + "-gpu-gpu-0", env: append(slices.Clone(gpu0Limited), "NVIDIA_VISIBLE_DEVICES="+gpu0UUID)},
				{name: commonName,
					env:    sorted(nriIdentity, aggregatesEmpty, neutralised(0, 3)),
					mounts: slices.Concat(libMounts, registryMount)},
			},
		},
		{
			name:   "library not installed: no library or preload mounts",
			mutate: func(o *Options) { o.LibraryInstalled = false; o.LibraryPath = ""; o.PreloadPath = "" },
			claim:  perClaimClaim(gpu0Result()),
			want: []wantDevice{
				{name: claimUID + "-gpu-gpu-0", env: gpu0Limited},
				{name: commonName,
					env:    sorted([]string{"MANAGER_VGPU_CLAIM_UID=", "MANAGER_CLIENT_REGISTER_UUID=" + registerUUID}, aggregatesEmpty, neutralised(0)),
					mounts: slices.Concat(registryMount, perClaimMounts)},
			},
		},
		{
			name:   "VGPU off: whole GPUs, no mounts, no identity, limits empty, still neutralised",
			mutate: func(o *Options) { o.VGPU = false; o.RegistryDir = "" },
			claim:  Claim{UID: claimUID, Results: []Result{gpu0Result(), gpu3Result()}},
			want: []wantDevice{
				{name: claimUID + "-gpu-gpu-0", env: []string{"CUDA_CORE_LIMIT_0=", "CUDA_MEM_LIMIT_0=", "MANAGER_VISIBLE_DEVICE_0=" + gpu0UUID}},
				{name: claimUID + "-gpu-gpu-3", env: gpu3Unlimited},
				{name: commonName, env: sorted(noIdentity, aggregatesEmpty, neutralised(0, 3))},
			},
		},
		{
			name:   "VGPU off ignores the per-claim path and env injection still applies",
			mutate: func(o *Options) { o.VGPU = false; o.GPUInjection = InjectionEnv },
			claim:  perClaimClaim(gpu0Result()),
			want: []wantDevice{
				{name: claimUID + "-gpu-gpu-0", env: []string{"CUDA_CORE_LIMIT_0=", "CUDA_MEM_LIMIT_0=", "MANAGER_VISIBLE_DEVICE_0=" + gpu0UUID, "NVIDIA_VISIBLE_DEVICES=" + gpu0UUID}},
				{name: commonName, env: sorted(noIdentity, aggregatesEmpty, neutralised(0))},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newTestWriter(t, tt.mutate)
			if err := w.validate(&tt.claim); err != nil {
				t.Fatalf("validate: %v", err)
			}
			spec := w.buildSpec(&tt.claim)
			if spec.Version != "0.5.0" || spec.Kind != qualifiedKind {
				t.Errorf("version %q kind %q, want 0.5.0 %q", spec.Version, spec.Kind, qualifiedKind)
			}
			if len(spec.Devices) != len(tt.want) {
				t.Fatalf("%d devices, want %d", len(spec.Devices), len(tt.want))
			}
			for i, want := range tt.want {
				got := spec.Devices[i]
				if got.Name != want.name {
					t.Errorf("device %d name %q, want %q", i, got.Name, want.name)
				}
				if !slices.Equal(got.ContainerEdits.Env, want.env) {
					t.Errorf("device %s env\n got %q\nwant %q", got.Name, got.ContainerEdits.Env, want.env)
				}
				var mounts []cdispec.Mount
				for _, m := range got.ContainerEdits.Mounts {
					mounts = append(mounts, *m)
				}
				if !slices.EqualFunc(mounts, want.mounts, mountEqual) {
					t.Errorf("device %s mounts\n got %+v\nwant %+v", got.Name, mounts, want.mounts)
				}
			}
		})
	}
}

func mountEqual(a, b cdispec.Mount) bool {
	return a.HostPath == b.HostPath && a.ContainerPath == b.ContainerPath && a.Type == b.Type && slices.Equal(a.Options, b.Options)
}

// The common device never sets a used index, and always covers every unused one in 0–15 with
// all three names; a result device sets only its own index.
func TestNeutralisationCoversUnusedIndicesOnly(t *testing.T) {
	w := newTestWriter(t, nil)
	c := nriClaim(gpu0Result(), gpu3Result(), Result{Request: "x", Device: "gpu-15", GPUIndex: 15, GPUUUID: "GPU-f"})
	spec := w.buildSpec(&c)
	common := spec.Devices[len(spec.Devices)-1].ContainerEdits.Env
	for _, used := range []string{"0", "3", "15"} {
		for _, pfx := range []string{contract.EnvVisibleDevicePfx, contract.EnvMemLimitPfx, contract.EnvCoreLimitPfx} {
			if slices.Contains(common, pfx+used+"=") {
				t.Errorf("common device neutralises used index: %s%s", pfx, used)
			}
		}
	}
	if got, want := len(common), 3*13+5; got != want {
		t.Errorf("common env has %d entries, want %d", got, want)
	}
}
