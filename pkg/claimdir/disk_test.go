package claimdir

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
)

// wantMode is a path and the exact mode bits (permissions, sticky) it must have on disk.
type wantMode struct {
	path string
	mode os.FileMode
}

func assertModes(t *testing.T, want []wantMode) {
	t.Helper()
	for _, w := range want {
		fi, err := os.Lstat(w.path)
		if err != nil {
			t.Errorf("%s: %v", w.path, err)
			continue
		}
		if !fi.IsDir() {
			t.Errorf("%s is not a directory (mode %v)", w.path, fi.Mode())
			continue
		}
		if got := fi.Mode() & modeBits; got != w.mode {
			t.Errorf("%s has mode %v, want %v", w.path, got, w.mode)
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Geteuid() {
			t.Errorf("%s is owned by uid %d, want %d", w.path, st.Uid, os.Geteuid())
		}
	}
}

func setModes(d Dirs) []wantMode {
	return []wantMode{
		{d.Root, 0o700},
		{d.Config, 0o755},
		{d.VGPULock, 0o777 | os.ModeSticky},
		{d.VMemNode, 0o777 | os.ModeSticky},
	}
}

// withUmask sets a restrictive umask for the test: the modes must not depend on it.
func withUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })
}

func TestEnsureCreatesModes(t *testing.T) {
	withUmask(t)
	tests := []struct {
		name   string
		ensure func(l Layout) (Dirs, error)
		want   func(l Layout) Dirs
	}{
		{
			name: "container dirs",
			ensure: func(l Layout) (Dirs, error) {
				prepared(t, l, claimA)
				return l.EnsureContainerDirs(claimA, pod1, "app")
			},
			want: func(l Layout) Dirs { d, _ := l.ContainerDirs(claimA, pod1, "app"); return d },
		},
		{
			name:   "per-claim dirs",
			ensure: func(l Layout) (Dirs, error) { prepared(t, l, claimA); return l.EnsurePerClaimDirs(claimA) },
			want:   func(l Layout) Dirs { d, _ := l.PerClaimDirs(claimA); return d },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := Layout{StateDir: filepath.Join(t.TempDir(), "state")}
			got, err := tt.ensure(l)
			if err != nil {
				t.Fatalf("ensure: %v", err)
			}
			if want := tt.want(l); got != want {
				t.Errorf("returned %+v, want %+v", got, want)
			}
			claimDir, _ := l.ClaimDir(claimA)
			modes := append([]wantMode{{l.ClaimsRoot(), 0o700}, {claimDir, 0o700}}, setModes(got)...)
			assertModes(t, modes)

			// A second call changes nothing and keeps what is inside.
			pids := filepath.Join(got.Config, "pids.config")
			if err := os.WriteFile(pids, []byte("1\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if again, err := tt.ensure(l); err != nil || again != got {
				t.Fatalf("second ensure = %+v, %v; want %+v, nil", again, err, got)
			}
			assertModes(t, modes)
			if b, err := os.ReadFile(pids); err != nil || string(b) != "1\n" {
				t.Errorf("pids.config after a second ensure = %q, %v", b, err)
			}

			// Wrong modes (a root container can chmod its mount points) are repaired.
			for _, m := range modes {
				if err := os.Chmod(m.path, 0o750|os.ModeSetgid); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := tt.ensure(l); err != nil {
				t.Fatalf("ensure after chmod: %v", err)
			}
			assertModes(t, modes)
		})
	}
}

func TestEnsureRepairsOwner(t *testing.T) {
	requireRoot(t)
	l := Layout{StateDir: t.TempDir()}
	prepared(t, l, claimA)
	d, err := l.EnsureContainerDirs(claimA, pod1, "app")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(d.VGPULock, 1234, 1234); err != nil {
		t.Fatal(err)
	}
	if _, err := l.EnsureContainerDirs(claimA, pod1, "app"); err != nil {
		t.Fatal(err)
	}
	assertModes(t, setModes(d))
}

func TestEnsureClaimDir(t *testing.T) {
	withUmask(t)
	l := Layout{StateDir: filepath.Join(t.TempDir(), "state")}
	for range 2 {
		if err := l.EnsureClaimDir(claimA); err != nil {
			t.Fatalf("EnsureClaimDir: %v", err)
		}
	}
	claimDir, _ := l.ClaimDir(claimA)
	assertModes(t, []wantMode{{l.StateDir, 0o755}, {l.ClaimsRoot(), 0o700}, {claimDir, 0o700}})
}

func TestClaimsRootOwnedByOther(t *testing.T) {
	requireRoot(t)
	l := Layout{StateDir: t.TempDir()}
	if err := os.Mkdir(l.ClaimsRoot(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(l.ClaimsRoot(), 1234, 1234); err != nil {
		t.Fatal(err)
	}
	err := l.EnsureClaimDir(claimA)
	var upe *UnsafePathError
	if !errors.As(err, &upe) || upe.Path != l.ClaimsRoot() {
		t.Fatalf("EnsureClaimDir = %v, want an *UnsafePathError for the claims root", err)
	}
	if entries, _ := os.ReadDir(l.ClaimsRoot()); len(entries) != 0 {
		t.Errorf("claims root holds %v, want nothing", entries)
	}
}

func TestListAndRemove(t *testing.T) {
	l := Layout{StateDir: t.TempDir()}
	// Nothing there yet: listing and removal are quiet.
	if uids, err := l.ListClaims(); err != nil || len(uids) != 0 {
		t.Fatalf("ListClaims without a claims root = %v, %v", uids, err)
	}
	if refs, err := l.ListContainerDirs(claimA); err != nil || len(refs) != 0 {
		t.Fatalf("ListContainerDirs without a claims root = %v, %v", refs, err)
	}
	if err := l.RemoveClaim(claimA); err != nil {
		t.Fatalf("RemoveClaim without a claims root: %v", err)
	}
	if err := l.RemoveContainerDirs(claimA, pod1, "app"); err != nil {
		t.Fatalf("RemoveContainerDirs without a claims root: %v", err)
	}

	prepared(t, l, claimA)
	for _, c := range []struct{ pod, name string }{{pod2, "b"}, {pod1, "sidecar"}, {pod1, "app"}} {
		if _, err := l.EnsureContainerDirs(claimA, c.pod, c.name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.EnsurePerClaimDirs(claimA); err != nil {
		t.Fatal(err)
	}
	if err := l.EnsureClaimDir(claimB); err != nil {
		t.Fatal(err)
	}
	claimDir, _ := l.ClaimDir(claimA)
	// Entries that must be skipped.
	junk := map[string]func(string) error{
		"not-a-container":         func(p string) error { return os.Mkdir(p, 0o700) },
		pod2 + "_UPPER":           func(p string) error { return os.Mkdir(p, 0o700) },
		pod2 + "_file":            func(p string) error { return os.WriteFile(p, nil, 0o600) },
		pod2 + "_link":            func(p string) error { return os.Symlink(claimDir+"/claim", p) },
		"0F6C2A8E-4B1D-4C3A-9E2F": func(p string) error { return os.Mkdir(p, 0o700) },
	}
	for name, mk := range junk {
		if err := mk(filepath.Join(claimDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	for name, mk := range map[string]func(string) error{
		"lost+found":                           func(p string) error { return os.Mkdir(p, 0o700) },
		"1a2b3c4d-5e6f-4a7b-8c9d-000000000000": func(p string) error { return os.WriteFile(p, nil, 0o600) },
	} {
		if err := mk(filepath.Join(l.ClaimsRoot(), name)); err != nil {
			t.Fatal(err)
		}
	}

	refs, err := l.ListContainerDirs(claimA)
	if err != nil {
		t.Fatal(err)
	}
	wantRefs := []ContainerRef{{pod1, "app"}, {pod1, "sidecar"}, {pod2, "b"}}
	if !reflect.DeepEqual(refs, wantRefs) {
		t.Errorf("ListContainerDirs = %v, want %v", refs, wantRefs)
	}
	uids, err := l.ListClaims()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{claimA, claimB}; !reflect.DeepEqual(uids, want) {
		t.Errorf("ListClaims = %v, want %v", uids, want)
	}

	// Remove one container, twice; the others stay.
	for range 2 {
		if err := l.RemoveContainerDirs(claimA, pod1, "sidecar"); err != nil {
			t.Fatalf("RemoveContainerDirs: %v", err)
		}
	}
	if refs, _ := l.ListContainerDirs(claimA); !reflect.DeepEqual(refs, []ContainerRef{{pod1, "app"}, {pod2, "b"}}) {
		t.Errorf("after removal ListContainerDirs = %v", refs)
	}
	// Remove the claim, twice; the other claim stays.
	for range 2 {
		if err := l.RemoveClaim(claimA); err != nil {
			t.Fatalf("RemoveClaim: %v", err)
		}
	}
	if _, err := os.Lstat(claimDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("claim directory still there after RemoveClaim (%v)", err)
	}
	if uids, _ := l.ListClaims(); !reflect.DeepEqual(uids, []string{claimB}) {
		t.Errorf("after RemoveClaim ListClaims = %v, want [%s]", uids, claimB)
	}
	if refs, err := l.ListContainerDirs(claimA); err != nil || len(refs) != 0 {
		t.Errorf("ListContainerDirs of a removed claim = %v, %v", refs, err)
	}
}

// prepared makes the claim directory as Prepare does: directory sets go into it.
func prepared(t *testing.T, l Layout, claimUID string) {
	t.Helper()
	if err := l.EnsureClaimDir(claimUID); err != nil {
		t.Fatal(err)
	}
}

// TestDirectorySetsNeedThePreparedClaimDir: a directory set is never what creates a claim's
// directory: the NRI hook of a claim unprepared meanwhile fails and leaves nothing behind.
func TestDirectorySetsNeedThePreparedClaimDir(t *testing.T) {
	l := Layout{StateDir: t.TempDir()}
	if _, err := l.EnsureContainerDirs(claimA, pod1, "app"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("EnsureContainerDirs without the claim directory: %v, want not exist", err)
	}
	if _, err := l.EnsurePerClaimDirs(claimA); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("EnsurePerClaimDirs without the claim directory: %v, want not exist", err)
	}
	if uids, _ := l.ListClaims(); len(uids) != 0 {
		t.Errorf("claim directories were created: %v", uids)
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root: it changes file ownership")
	}
}
