package claimdir

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

const (
	fsClaim = "3c2b1a0f-9e8d-4c7b-a6f5-e4d3c2b1a0f9"
	fsPod   = "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d"
	fsBytes = 1 << 20
)

// tmpfsLayout is a layout with claim file systems of fsBytes; every mount left below it is
// detached at the end, also when the test fails half-way.
func tmpfsLayout(t *testing.T) Layout {
	t.Helper()
	requireRoot(t)
	state := filepath.Join(t.TempDir(), "state")
	t.Cleanup(func() {
		for _, m := range mountsBelow(t, state) {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	})
	return Layout{StateDir: state, ClaimFSBytes: fsBytes}
}

// mountsBelow lists the mount points under dir from /proc/self/mountinfo.
func mountsBelow(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// TestClaimTmpfsBoundsWhatContainersWrite: a claim directory is a tmpfs of the configured size,
// mounted once however often it is ensured; a container filling its writable directories
// stops at the bound while the state directory's file system stays writable; Unprepare's
// removal unmounts it.
func TestClaimTmpfsBoundsWhatContainersWrite(t *testing.T) {
	l := tmpfsLayout(t)
	if err := l.EnsureClaimDir(fsClaim); err != nil {
		t.Fatal(err)
	}
	claimDir, _ := l.ClaimDir(fsClaim)
	var sfs unix.Statfs_t
	if err := unix.Statfs(claimDir, &sfs); err != nil {
		t.Fatal(err)
	}
	if sfs.Type != unix.TMPFS_MAGIC || sfs.Blocks*uint64(sfs.Bsize) != fsBytes {
		t.Fatalf("claim dir: file system type %#x with %d bytes, want tmpfs of %d", sfs.Type, sfs.Blocks*uint64(sfs.Bsize), fsBytes)
	}
	// Prepare again, recovery, NRI's container directories: still one mount.
	if err := l.EnsureClaimDir(fsClaim); err != nil {
		t.Fatal(err)
	}
	dirs, err := l.EnsureContainerDirs(fsClaim, fsPod, "app")
	if err != nil {
		t.Fatal(err)
	}
	if m := mountsBelow(t, l.StateDir); len(m) != 1 || m[0] != claimDir {
		t.Fatalf("mounts below the state dir: %v, want just %s", m, claimDir)
	}
	assertModes(t, append(setModes(dirs), wantMode{claimDir, modePrivate}))

	// The container fills /tmp/.vmem_node: it stops at the bound with ENOSPC.
	f, err := os.Create(filepath.Join(dirs.VMemNode, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{1}, 64<<10)
	written := 0
	for ; written < 4*fsBytes; written += len(chunk) {
		if _, err = f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) || written > fsBytes {
		t.Fatalf("filling the claim's tmpfs: wrote %d bytes, last error %v; want ENOSPC within %d bytes", written, err, fsBytes)
	}
	if err := os.WriteFile(filepath.Join(l.StateDir, "still-writable"), []byte("x"), 0o600); err != nil {
		t.Errorf("the state directory's file system is affected: %v", err)
	}

	if err := l.RemoveClaim(fsClaim); err != nil {
		t.Fatal(err)
	}
	if m := mountsBelow(t, l.StateDir); len(m) != 0 {
		t.Errorf("mounts left after RemoveClaim: %v", m)
	}
	if _, err := os.Lstat(claimDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("claim directory left after RemoveClaim: %v", err)
	}
	if err := l.RemoveClaim(fsClaim); err != nil {
		t.Errorf("second RemoveClaim: %v", err)
	}
}

// TestContainerDirsNeedTheClaimTmpfs: a claim directory whose tmpfs is gone (the claim was
// unprepared while a container was being created, or someone unmounted it) gets no container
// directories: they would land on the node's disk, without a bound.
func TestContainerDirsNeedTheClaimTmpfs(t *testing.T) {
	l := tmpfsLayout(t)
	if err := l.EnsureClaimDir(fsClaim); err != nil {
		t.Fatal(err)
	}
	claimDir, _ := l.ClaimDir(fsClaim)
	if err := unix.Unmount(claimDir, 0); err != nil {
		t.Fatal(err)
	}
	_, err := l.EnsureContainerDirs(fsClaim, fsPod, "app")
	var fsErr *ClaimFSError
	if !errors.As(err, &fsErr) || !strings.Contains(err.Error(), "not mounted") {
		t.Fatalf("EnsureContainerDirs on a claim without its tmpfs: %v, want a ClaimFSError", err)
	}
	if entries, _ := os.ReadDir(claimDir); len(entries) != 0 {
		t.Errorf("directories were made on the node's disk: %v", entries)
	}
	// Prepare (or start-up recovery) mounts it again.
	if err := l.EnsureClaimDir(fsClaim); err != nil {
		t.Fatal(err)
	}
	if _, err := l.EnsureContainerDirs(fsClaim, fsPod, "app"); err != nil {
		t.Errorf("after the claim is ensured again: %v", err)
	}
}

// TestClaimTmpfsOff: with ClaimFSBytes 0 nothing is mounted (the documented opt-out).
func TestClaimTmpfsOff(t *testing.T) {
	l := tmpfsLayout(t)
	l.ClaimFSBytes = 0
	if err := l.EnsureClaimDir(fsClaim); err != nil {
		t.Fatal(err)
	}
	if _, err := l.EnsurePerClaimDirs(fsClaim); err != nil {
		t.Fatal(err)
	}
	if m := mountsBelow(t, l.StateDir); len(m) != 0 {
		t.Errorf("mounted %v with ClaimFSBytes 0", m)
	}
}

// TestWriteConfig: the file lands whole with mode 0644, identical content is not rewritten,
// changed content replaces it, and no temporary file is left.
func TestWriteConfig(t *testing.T) {
	l := Layout{StateDir: filepath.Join(t.TempDir(), "state")}
	if err := l.EnsureClaimDir(fsClaim); err != nil {
		t.Fatal(err)
	}
	dirs, err := l.EnsurePerClaimDirs(fsClaim)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dirs.Config, contract.ContainerConfigName)
	first := contract.ContainerConfig{ClaimUID: fsClaim, RegisterUUID: fsPod}.Encode()
	if err := l.WriteConfig(dirs, first); err != nil {
		t.Fatal(err)
	}
	fi1, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi1.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", fi1.Mode().Perm())
	}
	if err := l.WriteConfig(dirs, first); err != nil {
		t.Fatal(err)
	}
	if fi2, _ := os.Stat(path); !os.SameFile(fi1, fi2) {
		t.Error("identical content was rewritten")
	}
	second := contract.ContainerConfig{ClaimUID: fsClaim, RegisterUUID: fsClaim}.Encode()
	if err := l.WriteConfig(dirs, second); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, second) {
		t.Errorf("file holds %q, want %q", got, second)
	}
	entries, _ := os.ReadDir(dirs.Config)
	if len(entries) != 1 {
		t.Errorf("config dir holds %d entries, want only %s", len(entries), contract.ContainerConfigName)
	}
}
