package claimdir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

const (
	claimA = "0f6c2a8e-4b1d-4c3a-9e2f-7a5b6c8d9e01"
	claimB = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
	pod1   = "9d8c7b6a-5f4e-4d3c-2b1a-0f9e8d7c6b5a"
	pod2   = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
)

func TestLayoutPaths(t *testing.T) {
	l := Layout{StateDir: "/var/lib/vgpu-dra"}
	claimDir, err := l.ClaimDir(claimA)
	if err != nil {
		t.Fatal(err)
	}
	perClaim, err := l.PerClaimDirs(claimA)
	if err != nil {
		t.Fatal(err)
	}
	ctr, err := l.ContainerDirs(claimA, pod1, "app")
	if err != nil {
		t.Fatal(err)
	}
	c := "/var/lib/vgpu-dra/claims/" + claimA
	d := c + "/" + pod1 + "_app"
	tests := []struct{ name, got, want string }{
		{"ClaimsRoot", l.ClaimsRoot(), "/var/lib/vgpu-dra/claims"},
		{"ClaimDir", claimDir, c},
		{"PerClaimDirs.Root", perClaim.Root, c + "/claim"},
		{"PerClaimDirs.Config", perClaim.Config, c + "/claim/config"},
		{"PerClaimDirs.VGPULock", perClaim.VGPULock, c + "/claim/vgpu_lock"},
		{"PerClaimDirs.VMemNode", perClaim.VMemNode, c + "/claim/vmem_node"},
		{"ContainerDirs.Root", ctr.Root, d},
		{"ContainerDirs.Config", ctr.Config, d + "/config"},
		{"ContainerDirs.VGPULock", ctr.VGPULock, d + "/vgpu_lock"},
		{"ContainerDirs.VMemNode", ctr.VMemNode, d + "/vmem_node"},
		{"RegistryDir", l.RegistryDir(), "/var/lib/vgpu-dra/registry"},
		{"RegistrySocket", l.RegistrySocket(), "/var/lib/vgpu-dra/registry/registry.sock"},
		{"LibDir", l.LibDir(), "/var/lib/vgpu-dra/lib"},
		{"LibraryPath", l.LibraryPath(), "/var/lib/vgpu-dra/lib/libvgpu.so"},
		{"PreloadPath", l.PreloadPath(), "/var/lib/vgpu-dra/lib/ld.so.preload"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %q, want %q", tt.name, tt.got, tt.want)
		}
	}
}

// TestInvalidNamesBuildNothing: every method that takes names refuses bad ones with an
// *contract.InvalidNameError before it builds a path or touches the disk.
func TestInvalidNamesBuildNothing(t *testing.T) {
	state := t.TempDir()
	l := Layout{StateDir: state}
	calls := []struct {
		name     string
		call     func(claim, pod, ctr string) error
		wantKind string
		claim    string
		pod      string
		ctr      string
	}{
		{"ClaimDir", func(c, _, _ string) error { _, err := l.ClaimDir(c); return err }, contract.KindClaimUID, "../x", pod1, "app"},
		{"PerClaimDirs", func(c, _, _ string) error { _, err := l.PerClaimDirs(c); return err }, contract.KindClaimUID, "ABC", pod1, "app"},
		{"ContainerDirs bad pod", func(c, p, n string) error { _, err := l.ContainerDirs(c, p, n); return err }, contract.KindPodUID, claimA, "../../etc", "app"},
		{"ContainerDirs bad name", func(c, p, n string) error { _, err := l.ContainerDirs(c, p, n); return err }, contract.KindContainerName, claimA, pod1, "../x"},
		{"EnsureClaimDir", func(c, _, _ string) error { return l.EnsureClaimDir(c) }, contract.KindClaimUID, "..", pod1, "app"},
		{"EnsurePerClaimDirs", func(c, _, _ string) error { _, err := l.EnsurePerClaimDirs(c); return err }, contract.KindClaimUID, "/etc", pod1, "app"},
		{"EnsureContainerDirs", func(c, p, n string) error { _, err := l.EnsureContainerDirs(c, p, n); return err }, contract.KindContainerName, claimA, pod1, "a_b"},
		{"RemoveClaim", func(c, _, _ string) error { return l.RemoveClaim(c) }, contract.KindClaimUID, ".", pod1, "app"},
		{"RemoveContainerDirs", func(c, p, n string) error { return l.RemoveContainerDirs(c, p, n) }, contract.KindPodUID, claimA, "x", "app"},
		{"ListContainerDirs", func(c, _, _ string) error { _, err := l.ListContainerDirs(c); return err }, contract.KindClaimUID, "", pod1, "app"},
	}
	for _, tt := range calls {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(tt.claim, tt.pod, tt.ctr)
			var ine *contract.InvalidNameError
			if !errors.As(err, &ine) || ine.Kind != tt.wantKind {
				t.Fatalf("err = %v, want an *contract.InvalidNameError for a %s", err, tt.wantKind)
			}
			if entries, err := os.ReadDir(state); err != nil || len(entries) != 0 {
				t.Errorf("state directory holds %v (%v), want nothing", entries, err)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(state, "claims")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("claims root exists after invalid calls (%v)", err)
	}
}
