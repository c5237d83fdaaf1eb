package checkpoint

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

const tmpfsOptions = "size=64k"

// mountTmpfs mounts a 64 KiB tmpfs on a fresh temporary directory and unmounts it when the
// test ends, whatever happened. It fails, rather than skips, without root: these faults are
// the point of the test and must not go quietly untested.
func mountTmpfs(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root: it mounts a small tmpfs to produce real ENOSPC and EROFS faults")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, tmpfsOptions); err != nil {
		t.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fillDisk writes to dir/filler until the file system is full.
func fillDisk(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v, want ENOSPC", dir, err)
			}
			return
		}
	}
}

func remount(t *testing.T, dir string, flags uintptr) {
	t.Helper()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_REMOUNT|flags, tmpfsOptions); err != nil {
		t.Fatalf("remount %s (flags %#x): %v", dir, flags, err)
	}
}

// TestUpdateOnFaultyDisk makes the write fail for real, on a full and on a read-only file
// system, and checks that nothing changes until the fault is repaired.
func TestUpdateOnFaultyDisk(t *testing.T) {
	tests := []struct {
		name      string
		breakDisk func(t *testing.T, dir string)
		repair    func(t *testing.T, dir string)
		wantErrno syscall.Errno
		extra     []string // files the fault itself leaves in the directory
	}{
		{
			name:      "full disk",
			breakDisk: fillDisk,
			repair: func(t *testing.T, dir string) {
				if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
					t.Fatal(err)
				}
			},
			wantErrno: syscall.ENOSPC,
			extra:     []string{"filler"},
		},
		{
			name:      "read-only file system",
			breakDisk: func(t *testing.T, dir string) { remount(t, dir, unix.MS_RDONLY) },
			repair:    func(t *testing.T, dir string) { remount(t, dir, 0) },
			wantErrno: syscall.EROFS,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := mountTmpfs(t)
			path := filepath.Join(dir, contract.CheckpointFile)
			s := openStore(t, path)
			if err := s.Update(putClaim(uidA, fullClaim())); err != nil {
				t.Fatalf("Update before the fault: %v", err)
			}
			before := readFile(t, path)
			snapBefore := s.Snapshot()

			tt.breakDisk(t, dir)
			err := s.Update(putClaim(uidB, fullClaim()))
			if !errors.Is(err, tt.wantErrno) {
				t.Fatalf("Update on a broken disk = %v, want an error wrapping %v", err, tt.wantErrno)
			}
			t.Logf("Update on a broken disk: %v", err)
			if got := readFile(t, path); !bytes.Equal(got, before) {
				t.Errorf("checkpoint changed on disk:\n got %s\nwant %s", got, before)
			}
			wantEntries := slices.Sorted(slices.Values(append([]string{contract.CheckpointFile}, tt.extra...)))
			if got := dirEntries(t, dir); !slices.Equal(got, wantEntries) {
				t.Errorf("directory holds %v, want %v (temporary file left?)", got, wantEntries)
			}
			if got := s.Snapshot(); !reflect.DeepEqual(got, snapBefore) {
				t.Errorf("Snapshot changed after a failed write: %+v", got)
			}
			if _, ok := s.Get(uidB); ok {
				t.Error("the failed claim is visible through Get")
			}

			tt.repair(t, dir)
			if err := s.Update(putClaim(uidB, fullClaim())); err != nil {
				t.Fatalf("Update after the repair: %v", err)
			}
			if got := openStore(t, path).Snapshot(); !hasClaims(got, []string{uidA, uidB}) {
				t.Errorf("file holds %+v after the repair, want claims A and B", got.Claims)
			}
		})
	}
}
