package claimdir

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// The operations an attack is tried against, all on claim A, pod 1, container "app".
var attackOps = map[string]func(l Layout) error{
	"EnsureClaimDir":      func(l Layout) error { return l.EnsureClaimDir(claimA) },
	"EnsurePerClaimDirs":  func(l Layout) error { _, err := l.EnsurePerClaimDirs(claimA); return err },
	"EnsureContainerDirs": func(l Layout) error { _, err := l.EnsureContainerDirs(claimA, pod1, "app"); return err },
	"RemoveClaim":         func(l Layout) error { return l.RemoveClaim(claimA) },
	"RemoveContainerDirs": func(l Layout) error { return l.RemoveContainerDirs(claimA, pod1, "app") },
	"ListClaims":          func(l Layout) error { _, err := l.ListClaims(); return err },
	"ListContainerDirs":   func(l Layout) error { _, err := l.ListContainerDirs(claimA); return err },
}

// outcome of an operation under attack.
const (
	safeOK  = "ok"     // succeeds without touching the victim (removal unlinks the symlink)
	refused = "unsafe" // fails with an *UnsafePathError
)

// TestSymlinkAttacks plants a symlink (or a file) at each level of the tree, pointing at a
// victim directory, runs every operation and checks that the victim is untouched and that
// the operation either refuses with an *UnsafePathError or succeeds safely.
func TestSymlinkAttacks(t *testing.T) {
	tests := []struct {
		name string
		// plant prepares the attack and returns the victim directory.
		plant func(t *testing.T, l Layout, outside string) string
		want  map[string]string // operation → outcome; operations not listed must be safeOK
	}{
		{
			name: "claims root is a symlink",
			plant: func(t *testing.T, l Layout, outside string) string {
				must(t, os.Symlink(outside, l.ClaimsRoot()))
				return outside
			},
			want: allOps(refused),
		},
		{
			name: "claim dir is a symlink",
			plant: func(t *testing.T, l Layout, outside string) string {
				must(t, l.EnsureClaimDir(claimB))
				must(t, os.Symlink(outside, claimPath(l, claimA)))
				return outside
			},
			want: map[string]string{
				"EnsureClaimDir": refused, "EnsurePerClaimDirs": refused, "EnsureContainerDirs": refused,
				"RemoveContainerDirs": refused, "ListContainerDirs": refused,
			},
		},
		{
			name: "claim dir is a file",
			plant: func(t *testing.T, l Layout, outside string) string {
				must(t, l.EnsureClaimDir(claimB))
				must(t, os.WriteFile(claimPath(l, claimA), []byte("x"), 0o600))
				return outside
			},
			want: map[string]string{
				"EnsureClaimDir": refused, "EnsurePerClaimDirs": refused, "EnsureContainerDirs": refused,
				"RemoveContainerDirs": refused, "ListContainerDirs": refused,
			},
		},
		{
			name: "container dir is a symlink",
			plant: func(t *testing.T, l Layout, outside string) string {
				must(t, l.EnsureClaimDir(claimA))
				must(t, os.Symlink(outside, containerPath(l, claimA, pod1, "app").Root))
				return outside
			},
			want: map[string]string{"EnsureContainerDirs": refused},
		},
		{
			name: "container dir is a relative symlink to another claim's container dir",
			plant: func(t *testing.T, l Layout, _ string) string {
				must(t, l.EnsureClaimDir(claimB))
				victim, err := l.EnsureContainerDirs(claimB, pod2, "victim")
				must(t, err)
				must(t, os.WriteFile(filepath.Join(victim.Config, "pids.config"), []byte("7\n"), 0o644))
				must(t, l.EnsureClaimDir(claimA))
				rel := filepath.Join("..", claimB, filepath.Base(victim.Root))
				must(t, os.Symlink(rel, containerPath(l, claimA, pod1, "app").Root))
				return victim.Root
			},
			want: map[string]string{"EnsureContainerDirs": refused},
		},
		{
			name: "vgpu_lock is a symlink",
			plant: func(t *testing.T, l Layout, outside string) string {
				must(t, l.EnsureClaimDir(claimA))
				d, err := l.EnsureContainerDirs(claimA, pod1, "app")
				must(t, err)
				must(t, os.Remove(d.VGPULock))
				must(t, os.Symlink(outside, d.VGPULock))
				return outside
			},
			want: map[string]string{"EnsureContainerDirs": refused},
		},
		{
			name: "config is a symlink",
			plant: func(t *testing.T, l Layout, outside string) string {
				must(t, l.EnsureClaimDir(claimA))
				d, err := l.EnsureContainerDirs(claimA, pod1, "app")
				must(t, err)
				must(t, os.Remove(d.Config))
				must(t, os.Symlink(outside, d.Config))
				return outside
			},
			want: map[string]string{"EnsureContainerDirs": refused},
		},
		{
			name: "config is a file",
			plant: func(t *testing.T, l Layout, outside string) string {
				must(t, l.EnsureClaimDir(claimA))
				d, err := l.EnsureContainerDirs(claimA, pod1, "app")
				must(t, err)
				must(t, os.Remove(d.Config))
				must(t, os.WriteFile(d.Config, nil, 0o644))
				return outside
			},
			want: map[string]string{"EnsureContainerDirs": refused},
		},
		{
			name: "per-claim dir set root is a symlink",
			plant: func(t *testing.T, l Layout, outside string) string {
				must(t, l.EnsureClaimDir(claimA))
				must(t, os.Symlink(outside, filepath.Join(claimPath(l, claimA), "claim")))
				return outside
			},
			want: map[string]string{"EnsurePerClaimDirs": refused},
		},
		{
			name: "per-claim vmem_node is a symlink",
			plant: func(t *testing.T, l Layout, outside string) string {
				must(t, l.EnsureClaimDir(claimA))
				d, err := l.EnsurePerClaimDirs(claimA)
				must(t, err)
				must(t, os.Remove(d.VMemNode))
				must(t, os.Symlink(outside, d.VMemNode))
				return outside
			},
			want: map[string]string{"EnsurePerClaimDirs": refused},
		},
		{
			// What a container can really do: plant links inside its read-write directories.
			name: "symlinks planted inside vgpu_lock and vmem_node",
			plant: func(t *testing.T, l Layout, outside string) string {
				must(t, l.EnsureClaimDir(claimA))
				d, err := l.EnsureContainerDirs(claimA, pod1, "app")
				must(t, err)
				must(t, os.Symlink(outside, filepath.Join(d.VGPULock, "dir-link")))
				must(t, os.Symlink(filepath.Join(outside, "sentinel"), filepath.Join(d.VGPULock, "file-link")))
				must(t, os.Mkdir(filepath.Join(d.VMemNode, "sub"), 0o777))
				must(t, os.Symlink(outside, filepath.Join(d.VMemNode, "sub", "deep-link")))
				must(t, os.Symlink("../../../../..", filepath.Join(d.VMemNode, "up")))
				return outside
			},
			want: map[string]string{},
		},
	}
	for _, tt := range tests {
		for op, run := range attackOps {
			want := tt.want[op]
			if want == "" {
				want = safeOK
			}
			t.Run(tt.name+"/"+op, func(t *testing.T) {
				base := t.TempDir()
				l := Layout{StateDir: filepath.Join(base, "state")}
				must(t, os.Mkdir(l.StateDir, 0o755))
				outside := makeOutside(t, base)
				victim := tt.plant(t, l, outside)
				before := snapshotTree(t, victim)

				err := run(l)
				switch want {
				case refused:
					var upe *UnsafePathError
					if !errors.As(err, &upe) {
						t.Errorf("%s = %v, want an *UnsafePathError", op, err)
					}
				case safeOK:
					if err != nil {
						t.Errorf("%s = %v, want success", op, err)
					}
				}
				if after := snapshotTree(t, victim); !reflect.DeepEqual(after, before) {
					t.Errorf("%s changed the victim %s:\n before %v\n after  %v", op, victim, before, after)
				}
				if want == safeOK {
					assertRemoved(t, l, op)
				}
			})
		}
	}
}

// assertRemoved checks that a successful removal removed its target, symlink or not.
func assertRemoved(t *testing.T, l Layout, op string) {
	t.Helper()
	var target string
	switch op {
	case "RemoveClaim":
		target = claimPath(l, claimA)
	case "RemoveContainerDirs":
		target = containerPath(l, claimA, pod1, "app").Root
	default:
		return
	}
	if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s left %s behind (%v)", op, target, err)
	}
}

// makeOutside creates a directory outside the state directory, with an unusual mode and a
// file in it, for attacks to aim at.
func makeOutside(t *testing.T, base string) string {
	outside := filepath.Join(base, "outside")
	must(t, os.Mkdir(outside, 0o711))
	must(t, os.Chmod(outside, 0o711))
	must(t, os.WriteFile(filepath.Join(outside, "sentinel"), []byte("keep me"), 0o640))
	must(t, os.Chmod(filepath.Join(outside, "sentinel"), 0o640))
	return outside
}

// snapshotTree records every entry below and including dir: path, mode and file content.
func snapshotTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	snap := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		entry := fi.Mode().String()
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			entry += " " + string(b)
		}
		snap[path] = entry
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	return snap
}

func allOps(outcome string) map[string]string {
	m := map[string]string{}
	for op := range attackOps {
		m[op] = outcome
	}
	return m
}

func claimPath(l Layout, claimUID string) string {
	p, err := l.ClaimDir(claimUID)
	if err != nil {
		panic(err)
	}
	return p
}

func containerPath(l Layout, claimUID, podUID, name string) Dirs {
	d, err := l.ContainerDirs(claimUID, podUID, name)
	if err != nil {
		panic(err)
	}
	return d
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
