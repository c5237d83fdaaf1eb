package registry_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// TestPIDsConfigNeverEmptyUnderLockSH: a reader loop that takes LOCK_SH, as the library
// does, never sees pids.config empty or torn while it is rewritten between a long and a
// short list (write in place, truncate after).
func TestPIDsConfigNeverEmptyUnderLockSH(t *testing.T) {
	dir := configDir(t, shortDir(t), "c")
	long := make([]int, 3000)
	for i := range long {
		long[i] = 100000 + i
	}
	short := []int{7}
	if err := registry.WritePIDsConfig(context.Background(), dir, func() ([]int, error) { return short, nil }); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{format(long): true, format(short): true}
	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for !stop.Load() {
				got, err := readLocked(filepath.Join(dir, "pids.config"))
				if err != nil {
					t.Error(err)
					return
				}
				if !want[got] {
					t.Errorf("reader saw %d bytes that are neither list (first line %q)", len(got), strings.SplitN(got, "\n", 2)[0])
					return
				}
				reads.Add(1)
			}
		})
	}
	for i := 0; i < 2000 && !t.Failed(); i++ {
		l := short
		if i%2 == 0 {
			l = long
		}
		if err := registry.WritePIDsConfig(context.Background(), dir, func() ([]int, error) { return l, nil }); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d locked reads during 2000 rewrites", reads.Load())
}

func format(pids []int) string {
	var b strings.Builder
	for _, p := range pids {
		b.WriteString(strconv.Itoa(p) + "\n")
	}
	return b.String()
}

func readLocked(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		return "", err
	}
	b, err := os.ReadFile(path) // another open file description: the lock above guards it
	return string(b), err
}

// TestPIDsConfigRefusals: never written empty (nor left empty when a first write fails); never through a symlink (file or directory);
// never into a FIFO or a hard-linked file; a foreign mode is fixed.
func TestPIDsConfigRefusals(t *testing.T) {
	root := shortDir(t)
	dir := configDir(t, root, "c")
	one := func() ([]int, error) { return []int{1}, nil }

	if err := registry.WritePIDsConfig(context.Background(), dir, func() ([]int, error) { return nil, nil }); err == nil {
		t.Fatal("wrote an empty pids.config")
	}
	if _, err := os.Stat(filepath.Join(dir, "pids.config")); !os.IsNotExist(err) {
		t.Fatalf("a refused first write left pids.config behind: %v", err)
	}
	listErr := errors.New("cgroup gone")
	if err := registry.WritePIDsConfig(context.Background(), dir, func() ([]int, error) { return nil, listErr }); !errors.Is(err, listErr) {
		t.Fatalf("list error: %v", err)
	}

	victim := filepath.Join(root, "victim")
	if err := os.WriteFile(victim, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, plant := range map[string]func(p string) error{
		"symlink":   func(p string) error { return os.Symlink(victim, p) },
		"hard link": func(p string) error { return os.Link(victim, p) },
		"fifo":      func(p string) error { return unix.Mkfifo(p, 0o644) },
	} {
		d := configDir(t, root, strings.ReplaceAll(name, " ", "-"))
		if err := plant(filepath.Join(d, "pids.config")); err != nil {
			t.Fatal(err)
		}
		if err := registry.WritePIDsConfig(context.Background(), d, one); err == nil {
			t.Errorf("%s: written through", name)
		}
	}
	linkDir := filepath.Join(root, "linkdir")
	if err := os.Symlink(dir, linkDir); err != nil {
		t.Fatal(err)
	}
	if err := registry.WritePIDsConfig(context.Background(), linkDir, one); err == nil {
		t.Error("written through a symlinked config dir")
	}
	if b, _ := os.ReadFile(victim); string(b) != "secret\n" {
		t.Fatalf("victim changed: %q", b)
	}

	p := filepath.Join(dir, "pids.config")
	if err := registry.WritePIDsConfig(context.Background(), dir, one); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := registry.WritePIDsConfig(context.Background(), dir, func() ([]int, error) { return []int{3, 12}, nil }); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if got := readPIDs(t, dir); !slices.Equal(got, []int{3, 12}) || st.Mode().Perm() != 0o644 {
		t.Fatalf("pids.config %v mode %v", got, st.Mode())
	}
}

// TestPIDsConfigLockDeadline: while another process's reader holds LOCK_SH, a write ends with
// its context — ErrLocked past the deadline, context.Canceled when cancelled — and however
// many writes give up, at most one flock(2) call stays blocked (one goroutine, one
// descriptor). Once the reader lets go, the next write succeeds and nothing stays blocked.
func TestPIDsConfigLockDeadline(t *testing.T) {
	dir := configDir(t, shortDir(t), "c")
	one := func() ([]int, error) { return []int{1}, nil }
	if err := registry.WritePIDsConfig(context.Background(), dir, one); err != nil {
		t.Fatal(err)
	}
	reader, err := os.Open(filepath.Join(dir, "pids.config"))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if err := unix.Flock(int(reader.Fd()), unix.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	fdsBefore := openFDs(t)
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		err := registry.WritePIDsConfig(ctx, dir, one)
		cancel()
		if !errors.Is(err, registry.ErrLocked) {
			t.Fatalf("write while a reader holds the lock: %v; want ErrLocked", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := registry.WritePIDsConfig(ctx, dir, one); !errors.Is(err, context.Canceled) {
		t.Fatalf("write with a cancelled context: %v; want context.Canceled", err)
	}
	if n := registry.BlockedLocks(); n != 1 {
		t.Fatalf("%d abandoned flock calls still blocked, want 1", n)
	}
	if fds := openFDs(t); fds > fdsBefore+1 {
		t.Fatalf("%d descriptors open after 21 abandoned writes, %d before: want at most one more", fds, fdsBefore)
	}
	if err := unix.Flock(int(reader.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if err := registry.WritePIDsConfig(context.Background(), dir, func() ([]int, error) { return []int{2}, nil }); err != nil {
		t.Fatalf("write once the reader let go: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "pids.config")); string(b) != "2\n" {
		t.Fatalf("pids.config = %q", b)
	}
	waitFor(t, "the abandoned flock call to return", func() bool { return registry.BlockedLocks() == 0 })
}

func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}
