package cdi

import (
	"errors"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

func TestWriteRefusesInvalidClaims(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Options)
		claim  func() Claim
	}{
		{"no results", nil, func() Claim { return nriClaim() }},
		{"unknown path", nil, func() Claim { c := nriClaim(gpu0Result()); c.Path = "eager"; return c }},
		{"NRI path with register UUID", nil, func() Claim { c := nriClaim(gpu0Result()); c.RegisterUUID = registerUUID; return c }},
		{"NRI path with per-claim dirs", nil, func() Claim {
			c := nriClaim(gpu0Result())
			c.PerClaimDirs.Config = hostConfig
			return c
		}},
		{"per-claim path without register UUID", nil, func() Claim { c := perClaimClaim(gpu0Result()); c.RegisterUUID = ""; return c }},
		{"per-claim path, upper-case register UUID", nil, func() Claim {
			c := perClaimClaim(gpu0Result())
			c.RegisterUUID = "7C1E5A2B-3D4F-4E6A-8B9C-0D1E2F3A4B5C"
			return c
		}},
		{"per-claim path, relative dir", nil, func() Claim { c := perClaimClaim(gpu0Result()); c.PerClaimDirs.VMemNode = "vmem"; return c }},
		{"per-claim path, missing dir", nil, func() Claim { c := perClaimClaim(gpu0Result()); c.PerClaimDirs.VGPULock = ""; return c }},
		{"per-claim path, two results on one GPU", nil, func() Claim {
			r := gpu0Result()
			r.Request = "b"
			return perClaimClaim(gpu0Result(), r)
		}},
		{"memory not a multiple of 1 MiB", nil, func() Claim { r := gpu0Result(); r.MemoryBytes = 1<<20 + 1; return nriClaim(r) }},
		{"negative memory", nil, func() Claim { r := gpu0Result(); r.MemoryBytes = -1 << 20; return nriClaim(r) }},
		{"cores over 100", nil, func() Claim { r := gpu0Result(); r.Cores = 101; return nriClaim(r) }},
		{"negative cores", nil, func() Claim { r := gpu0Result(); r.Cores = -1; return nriClaim(r) }},
		{"negative GPU index", nil, func() Claim { r := gpu0Result(); r.GPUIndex = -1; return nriClaim(r) }},
		{"empty request", nil, func() Claim { r := gpu0Result(); r.Request = ""; return nriClaim(r) }},
		{"empty device", nil, func() Claim { r := gpu0Result(); r.Device = ""; return nriClaim(r) }},
		{"request not a CDI name", nil, func() Claim { r := gpu0Result(); r.Request = "a b"; return nriClaim(r) }},
		{"device name ends badly", nil, func() Claim { r := gpu0Result(); r.Device = "gpu-"; return nriClaim(r) }},
		{"GPU UUID with a comma", nil, func() Claim { r := gpu0Result(); r.GPUUUID = "GPU-1,GPU-2"; return nriClaim(r) }},
		{"empty GPU UUID", nil, func() Claim { r := gpu0Result(); r.GPUUUID = ""; return nriClaim(r) }},
		{"two results with one name", nil, func() Claim { return nriClaim(gpu0Result(), gpu0Result()) }},
		{"one index, two UUIDs", nil, func() Claim { r := gpu3Result(); r.GPUIndex = 0; return nriClaim(gpu0Result(), r) }},
		{"one UUID, two indices", nil, func() Claim { r := gpu3Result(); r.GPUUUID = gpu0UUID; return nriClaim(gpu0Result(), r) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newTestWriter(t, tt.mutate)
			if err := w.Write(tt.claim()); !errors.Is(err, ErrInvalidClaim) {
				t.Errorf("Write: %v, want ErrInvalidClaim", err)
			}
			if got := specFiles(t, w.opts.SpecDir); len(got) != 0 {
				t.Errorf("spec dir holds %q", got)
			}
		})
	}
}

func TestWriteAcceptsEdgeClaims(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Options)
		claim  Claim
	}{
		{"NRI path, two results on one GPU", nil, nriClaim(gpu0Result(), Result{Request: "b", Device: "gpu-0", GPUIndex: 0, GPUUUID: gpu0UUID})},
		{"index above 15", nil, nriClaim(Result{Request: "gpu", Device: "gpu-16", GPUIndex: 16, GPUUUID: "GPU-16"})},
		{"VGPU off: path and limits are not used", func(o *Options) { o.VGPU = false },
			Claim{UID: claimUID, Results: []Result{{Request: "gpu", Device: "gpu-0", GPUUUID: gpu0UUID, MemoryBytes: 3, Cores: 500}}}},
		{"MIG UUID", nil, nriClaim(Result{Request: "gpu", Device: "gpu-0", GPUUUID: "MIG-0a1b2c3d-1111-2222-3333-444455556666", Cores: 1})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newTestWriter(t, tt.mutate)
			if err := w.Write(tt.claim); err != nil {
				t.Errorf("Write: %v", err)
			}
		})
	}
}

func TestNewWriterRefusesInvalidOptions(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Options)
	}{
		{"empty driver name", func(o *Options) { o.DriverName = "" }},
		{"driver name with a slash", func(o *Options) { o.DriverName = "vgpu/dra" }},
		{"relative spec dir", func(o *Options) { o.SpecDir = "cdi" }},
		{"empty spec dir", func(o *Options) { o.SpecDir = "" }},
		{"empty injection", func(o *Options) { o.GPUInjection = "" }},
		{"unknown injection", func(o *Options) { o.GPUInjection = "volume-mounts" }},
		{"relative registry dir", func(o *Options) { o.RegistryDir = "registry" }},
		{"library installed without path", func(o *Options) { o.LibraryPath = "" }},
		{"library installed without preload path", func(o *Options) { o.PreloadPath = "" }},
		{"GPU CDI kind without class", func(o *Options) { o.GPUCDIKind = "nvidia.com" }},
		{"GPU CDI kind with bad class", func(o *Options) { o.GPUCDIKind = "nvidia.com/gpu=" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions(t)
			tt.mutate(&o)
			if _, err := NewWriter(o); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("NewWriter: %v, want ErrInvalidOptions", err)
			}
		})
	}
	// VGPU off needs no library, preload or registry paths.
	o := testOptions(t)
	o.VGPU, o.RegistryDir, o.LibraryPath, o.PreloadPath, o.GPUCDIKind = false, "", "", "", ""
	if _, err := NewWriter(o); err != nil {
		t.Errorf("NewWriter, VGPU off: %v", err)
	}
	o = testOptions(t)
	o.GPUCDIKind = contract.DefaultGPUCDIKind
	if _, err := NewWriter(o); err != nil {
		t.Errorf("NewWriter, defaults: %v", err)
	}
}
