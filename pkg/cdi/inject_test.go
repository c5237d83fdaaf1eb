package cdi

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// imageEnv is what a hostile or stale image may carry; CDI must replace every vGPU name in it.
var imageEnv = []string{
	"PATH=/usr/bin",
	"MANAGER_VGPU_CLAIM_UID=forged",
	"MANAGER_CLIENT_REGISTER_UUID=forged",
	"MANAGER_VISIBLE_DEVICE_5=GPU-forged",
	"CUDA_MEM_LIMIT_0=99999m",
	"CUDA_MEM_LIMIT_5=1m",
	"CUDA_CORE_LIMIT_15=1",
	"CUDA_MEM_LIMIT=1g",
	"MANAGER_VISIBLE_DEVICES=all",
}

// writeFakeGPUSpec stands in for the NVIDIA Container Toolkit's spec, so that the GPU CDI IDs in
// DeviceIDs resolve as they do on a node.
func writeFakeGPUSpec(t *testing.T, dir string, uuids ...string) {
	t.Helper()
	spec := cdispec.Spec{Version: "0.5.0", Kind: "nvidia.com/gpu"}
	for _, u := range uuids {
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           u,
			ContainerEdits: cdispec.ContainerEdits{Env: []string{"FAKE_TOOLKIT_GPU=" + u}},
		})
	}
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.com-gpu.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// inject loads dir with the CDI library's cache (no auto-refresh) and injects ids into an OCI
// spec whose process env is the image's, as containerd does when it creates a container.
func inject(t *testing.T, dir string, ids []string) *oci.Spec {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) != 0 {
		t.Fatalf("CDI cache errors: %v", errs)
	}
	spec := &oci.Spec{Process: &oci.Process{Env: slices.Clone(imageEnv)}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatalf("InjectDevices(%q): unresolved %q: %v", ids, unresolved, err)
	}
	return spec
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := m[k]; dup {
			panic("duplicate env " + k)
		}
		m[k] = v
	}
	return m
}

func TestWrittenSpecInjectsIntoOCISpec(t *testing.T) {
	roBind := []string{"ro", "nosuid", "nodev", "bind"}
	rwBind := []string{"rw", "nosuid", "nodev", "bind"}
	tests := []struct {
		name       string
		mutate     func(*Options)
		claim      Claim
		wantEnv    map[string]string // checked exactly, together with the untouched image env
		wantMounts map[string]oci.Mount
	}{
		{
			name:  "NRI path, two GPUs",
			claim: nriClaim(gpu0Result(), gpu3Result()),
			wantEnv: map[string]string{
				"MANAGER_VGPU_CLAIM_UID": claimUID, "MANAGER_CLIENT_REGISTER_UUID": "",
				"MANAGER_VISIBLE_DEVICE_0": gpu0UUID, "CUDA_MEM_LIMIT_0": "4096m", "CUDA_CORE_LIMIT_0": "30",
				"MANAGER_VISIBLE_DEVICE_3": gpu3UUID, "CUDA_MEM_LIMIT_3": "", "CUDA_CORE_LIMIT_3": "",
				"FAKE_TOOLKIT_GPU": gpu3UUID, // the toolkit's env, last device wins
			},
			wantMounts: map[string]oci.Mount{
				"/etc/vgpu-dra/lib/libvgpu.so": {Source: hostLibrary, Type: "bind", Options: roBind},
				"/etc/ld.so.preload":           {Source: hostPreload, Type: "bind", Options: roBind},
				"/etc/vgpu-dra/registry":       {Source: hostRegistry, Type: "bind", Options: roBind},
			},
		},
		{
			name:  "per-claim path",
			claim: perClaimClaim(gpu0Result()),
			wantEnv: map[string]string{
				"MANAGER_VGPU_CLAIM_UID": "", "MANAGER_CLIENT_REGISTER_UUID": registerUUID,
				"MANAGER_VISIBLE_DEVICE_0": gpu0UUID, "CUDA_MEM_LIMIT_0": "4096m", "CUDA_CORE_LIMIT_0": "30",
				"FAKE_TOOLKIT_GPU": gpu0UUID,
			},
			wantMounts: map[string]oci.Mount{
				"/etc/vgpu-dra/lib/libvgpu.so": {Source: hostLibrary, Type: "bind", Options: roBind},
				"/etc/ld.so.preload":           {Source: hostPreload, Type: "bind", Options: roBind},
				"/etc/vgpu-dra/registry":       {Source: hostRegistry, Type: "bind", Options: roBind},
				"/etc/vgpu-dra/config":         {Source: hostConfig, Type: "bind", Options: roBind},
				"/tmp/.vgpu_lock":              {Source: hostVGPULock, Type: "bind", Options: rwBind},
				"/tmp/.vmem_node":              {Source: hostVMemNode, Type: "bind", Options: rwBind},
			},
		},
		{
			name:   "env injection, library not installed",
			mutate: func(o *Options) { o.GPUInjection = InjectionEnv; o.LibraryInstalled = false },
			claim:  nriClaim(gpu0Result()),
			wantEnv: map[string]string{
				"MANAGER_VGPU_CLAIM_UID": claimUID, "MANAGER_CLIENT_REGISTER_UUID": "",
				"MANAGER_VISIBLE_DEVICE_0": gpu0UUID, "CUDA_MEM_LIMIT_0": "4096m", "CUDA_CORE_LIMIT_0": "30",
				"NVIDIA_VISIBLE_DEVICES": gpu0UUID,
			},
			wantMounts: map[string]oci.Mount{
				"/etc/vgpu-dra/registry": {Source: hostRegistry, Type: "bind", Options: roBind},
			},
		},
		{
			name:   "VGPU off",
			mutate: func(o *Options) { o.VGPU = false },
			claim:  Claim{UID: claimUID, Results: []Result{gpu0Result()}},
			wantEnv: map[string]string{
				"MANAGER_VGPU_CLAIM_UID": "", "MANAGER_CLIENT_REGISTER_UUID": "",
				"MANAGER_VISIBLE_DEVICE_0": gpu0UUID, "CUDA_MEM_LIMIT_0": "", "CUDA_CORE_LIMIT_0": "",
				"FAKE_TOOLKIT_GPU": gpu0UUID,
			},
			wantMounts: map[string]oci.Mount{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newTestWriter(t, tt.mutate)
			if err := w.Write(tt.claim); err != nil {
				t.Fatalf("Write: %v", err)
			}
			// A second claim in the same directory must not leak into this container.
			other := nriClaim(gpu3Result())
			other.UID = claimUID2
			if err := w.Write(other); err != nil {
				t.Fatalf("Write other: %v", err)
			}
			writeFakeGPUSpec(t, w.opts.SpecDir, gpu0UUID, gpu3UUID)

			var ids []string
			for _, perResult := range w.DeviceIDs(tt.claim) {
				ids = append(ids, perResult...)
			}
			spec := inject(t, w.opts.SpecDir, ids)

			want := map[string]string{"PATH": "/usr/bin", "MANAGER_VISIBLE_DEVICES": "", "CUDA_MEM_LIMIT": "", "CUDA_CORE_LIMIT": ""}
			for _, kv := range neutralised() {
				want[strings.TrimSuffix(kv, "=")] = ""
			}
			for k, v := range tt.wantEnv {
				want[k] = v
			}
			got := envMap(spec.Process.Env)
			for k, v := range want {
				if g, ok := got[k]; !ok || g != v {
					t.Errorf("env %s = %q (present %v), want %q", k, g, ok, v)
				}
			}
			for k := range got {
				if _, ok := want[k]; !ok {
					t.Errorf("unexpected env %s=%q", k, got[k])
				}
			}

			if len(spec.Mounts) != len(tt.wantMounts) {
				t.Errorf("%d mounts, want %d: %+v", len(spec.Mounts), len(tt.wantMounts), spec.Mounts)
			}
			for _, m := range spec.Mounts {
				wm, ok := tt.wantMounts[m.Destination]
				if !ok || m.Source != wm.Source || m.Type != wm.Type || !slices.Equal(m.Options, wm.Options) {
					t.Errorf("mount %s: got %+v, want %+v", m.Destination, m, wm)
				}
			}
		})
	}
}
