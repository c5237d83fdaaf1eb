package cdi

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestResultDeviceName(t *testing.T) {
	tests := []struct {
		name string
		r    Result
		want string
	}{
		{"plain", Result{Request: "gpu", Device: "gpu-0"}, claimUID + "-gpu-gpu-0"},
		{"share ID, first 8 characters", Result{Request: "gpu", Device: "gpu-1", ShareID: shareID}, claimUID + "-gpu-gpu-1-a1b2c3d4"},
		{"short share ID kept whole", Result{Request: "gpu", Device: "gpu-1", ShareID: "abc"}, claimUID + "-gpu-gpu-1-abc"},
		{"sub-request slash becomes underscore", Result{Request: "train/big", Device: "gpu-2"}, claimUID + "-train_big-gpu-2"},
		{"sub-request and share ID", Result{Request: "a/b", Device: "gpu-7", ShareID: shareID}, claimUID + "-a_b-gpu-7-a1b2c3d4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := resultDeviceName(claimUID, &tt.r); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSpecPath(t *testing.T) {
	w := newTestWriter(t, nil)
	want := filepath.Join(w.opts.SpecDir, "vgpu.dra.dev-claim_"+claimUID+".json")
	if got := w.SpecPath(claimUID); got != want {
		t.Errorf("SpecPath = %q, want %q", got, want)
	}
	for _, bad := range []string{"", "../../etc/passwd", "0B9D3F2E-6A7C-4F21-9E0D-3C5B7A1F8E42", claimUID + "/x", claimUID[:35]} {
		if got := w.SpecPath(bad); got != "" {
			t.Errorf("SpecPath(%q) = %q, want empty", bad, got)
		}
	}
}

func TestDeviceIDs(t *testing.T) {
	own0 := qualifiedKind + "=" + claimUID + "-gpu-gpu-0"
	own3 := qualifiedKind + "=" + claimUID + "-gpu-gpu-3"
	common := qualifiedKind + "=" + commonName
	tests := []struct {
		name   string
		mutate func(*Options)
		want   [][]string
	}{
		{"cdi injection lists the GPU's own CDI device", nil, [][]string{
			{own0, common, "nvidia.com/gpu=" + gpu0UUID},
			{own3, common, "nvidia.com/gpu=" + gpu3UUID},
		}},
		{"env injection: no GPU CDI device", func(o *Options) { o.GPUInjection = InjectionEnv }, [][]string{
			{own0, common}, {own3, common},
		}},
		{"no injection", func(o *Options) { o.GPUInjection = InjectionNone }, [][]string{
			{own0, common}, {own3, common},
		}},
		{"empty GPU CDI kind (simulated mode)", func(o *Options) { o.GPUCDIKind = "" }, [][]string{
			{own0, common}, {own3, common},
		}},
		{"other GPU CDI kind and driver name", func(o *Options) { o.GPUCDIKind = "example.com/gpu"; o.DriverName = "x.example" }, [][]string{
			{"x.example/claim=" + claimUID + "-gpu-gpu-0", "x.example/claim=" + commonName, "example.com/gpu=" + gpu0UUID},
			{"x.example/claim=" + claimUID + "-gpu-gpu-3", "x.example/claim=" + commonName, "example.com/gpu=" + gpu3UUID},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newTestWriter(t, tt.mutate)
			got := w.DeviceIDs(nriClaim(gpu0Result(), gpu3Result()))
			if !slices.EqualFunc(got, tt.want, slices.Equal) {
				t.Errorf("DeviceIDs =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

// TestClaimUIDOf: the NRI plugin recognises our claim devices among a container's CDI devices
// by this parser alone; every name DeviceIDs builds parses back to its claim, nothing else does.
func TestClaimUIDOf(t *testing.T) {
	w := newTestWriter(t, nil)
	for _, ids := range w.DeviceIDs(nriClaim(gpu0Result(), gpu3Result())) {
		for _, id := range ids[:2] {
			if uid, ok := ClaimUIDOf(testDriver, id); !ok || uid != claimUID {
				t.Errorf("ClaimUIDOf(%q) = %q, %v; want %q, true", id, uid, ok, claimUID)
			}
		}
	}
	for _, id := range []string{
		"nvidia.com/gpu=" + gpu0UUID,              // another vendor
		"other.dev/claim=" + claimUID + "-common", // another driver
		"vgpu.dra.dev/other=" + claimUID + "-common",
		"vgpu.dra.dev/claim=" + claimUID, // no '-' after the UID
		"vgpu.dra.dev/claim=" + strings.ToUpper(claimUID) + "-common",
		"vgpu.dra.dev/claim=short-common",
		"vgpu.dra.dev/claim",
		"",
	} {
		if uid, ok := ClaimUIDOf(testDriver, id); ok {
			t.Errorf("ClaimUIDOf(%q) = %q, true; want false", id, uid)
		}
	}
}
