package fsutil

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

func TestWriteFileAtomic(t *testing.T) {
	tests := []struct {
		name     string
		existing []byte // nil: no file before the write
		data     []byte
		perm     os.FileMode
	}{
		{name: "new file", data: []byte("hello\n"), perm: 0o600},
		{name: "replaces existing", existing: []byte("old content that is longer"), data: []byte("new"), perm: 0o644},
		{name: "empty data", existing: []byte("x"), data: []byte{}, perm: 0o600},
		{name: "mode not limited by umask", data: []byte("w"), perm: 0o666},
	}
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f.json")
			if tt.existing != nil {
				if err := os.WriteFile(path, tt.existing, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := WriteFileAtomic(path, tt.data, tt.perm); err != nil {
				t.Fatalf("WriteFileAtomic: %v", err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tt.data) {
				t.Errorf("content = %q, want %q", got, tt.data)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != tt.perm {
				t.Errorf("mode = %v, want %v", fi.Mode().Perm(), tt.perm)
			}
			assertOnlyEntries(t, dir, "f.json")
		})
	}
}

func TestWriteFileAtomicFailures(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the target path
	}{
		{
			name:  "directory missing",
			setup: func(t *testing.T, dir string) string { return filepath.Join(dir, "missing", "f") },
		},
		{
			// rename(2) of a file over a non-empty directory fails after the temp file is written.
			name: "target is a directory",
			setup: func(t *testing.T, dir string) string {
				target := filepath.Join(dir, "f")
				if err := os.MkdirAll(filepath.Join(target, "child"), 0o700); err != nil {
					t.Fatal(err)
				}
				return target
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tt.setup(t, dir)
			before := listDir(t, dir)
			err := WriteFileAtomic(path, []byte("data"), 0o600)
			if err == nil {
				t.Fatal("WriteFileAtomic succeeded, want an error")
			}
			if after := listDir(t, dir); !slices.Equal(before, after) {
				t.Errorf("directory entries changed from %v to %v (temporary file left?)", before, after)
			}
		})
	}
}

func TestSyncDirMissing(t *testing.T) {
	err := SyncDir(filepath.Join(t.TempDir(), "nope"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("SyncDir on a missing directory: %v, want a not-exist error", err)
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func assertOnlyEntries(t *testing.T, dir string, want ...string) {
	t.Helper()
	if got := listDir(t, dir); !slices.Equal(got, want) {
		t.Errorf("entries of %s = %v, want %v", dir, got, want)
	}
}

func TestRemoveTempFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.json")
	keep := []string{"f.json", ".g.json.tmp-1", "f.json.tmp-2", "other"}
	stale := []string{".f.json.tmp-123", ".f.json.tmp-abc"}
	for _, name := range append(append([]string{}, keep...), stale...) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := RemoveTempFiles(path); err != nil {
		t.Fatalf("RemoveTempFiles: %v", err)
	}
	slices.Sort(keep)
	assertOnlyEntries(t, dir, keep...)
}
