package claimdir

import (
	"os"
	"path/filepath"
	"testing"
)

// TestInstallLibrary: the library and the preload file land in <state>/lib; an unchanged
// library is not replaced (running containers' bind mounts pin the old inode anyway, but a
// rewrite would be pointless churn), a changed one is replaced by rename, and a missing source
// keeps what an earlier install left.
func TestInstallLibrary(t *testing.T) {
	l := Layout{StateDir: t.TempDir()}
	src := filepath.Join(t.TempDir(), "libvgpu.so")
	if err := os.WriteFile(src, []byte("v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := l.InstallLibrary(src)
	if err != nil || !got.Installed || got.Bytes != 2 {
		t.Fatalf("first install: %+v, %v", got, err)
	}
	if b, _ := os.ReadFile(l.PreloadPath()); string(b) != "/etc/vgpu-dra/lib/libvgpu.so\n" {
		t.Errorf("ld.so.preload = %q", b)
	}
	first, _ := os.Stat(l.LibraryPath())
	if _, err := l.InstallLibrary(src); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Stat(l.LibraryPath()); !os.SameFile(first, again) {
		t.Error("an unchanged library was rewritten")
	}
	if err := os.WriteFile(src, []byte("v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := l.InstallLibrary(src); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(l.LibraryPath()); string(b) != "v2" {
		t.Errorf("after a new version the library holds %q", b)
	}
	st, _ := os.Stat(l.LibraryPath())
	if os.SameFile(first, st) || st.Mode().Perm() != 0o644 {
		t.Errorf("a changed library was not replaced by a new file with mode 0644 (mode %v)", st.Mode())
	}
	got, err = l.InstallLibrary(filepath.Join(t.TempDir(), "missing.so"))
	if err != nil || !got.Installed || !got.SourceMissing {
		t.Errorf("missing source: %+v, %v; want the earlier install kept", got, err)
	}
	if got, _ := (Layout{StateDir: t.TempDir()}).InstallLibrary(""); got.Installed {
		t.Error("nothing installed, yet Installed")
	}
}
