package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/fsutil"
)

// Canonical UIDs used across the tests.
const (
	uidA = "0f6c2a8e-4b1d-4c3a-9e2f-7a5b6c8d9e01"
	uidB = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
	podX = "9d8c7b6a-5f4e-4d3c-2b1a-0f9e8d7c6b5a"
	podY = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
)

// fullClaim is a claim with every field set to a non-zero value.
func fullClaim() Claim {
	return Claim{
		Namespace:    "team-a",
		Name:         "train-gpu",
		State:        PrepareCompleted,
		Path:         contract.PathPerClaim,
		ReservedFor:  []string{podX, podY},
		RegisterUUID: "5b1e0c3d-2a4f-4b6c-8d7e-9f0a1b2c3d4e",
		Devices: []Device{{
			Request:      "gpu",
			Pool:         "node-1",
			Device:       "gpu-0",
			ShareID:      "7c2d9e1f-0a3b-4c5d-8e6f-1a2b3c4d5e6f",
			GPUUUID:      "GPU-3b2a1c0d-9e8f-7a6b-5c4d-3e2f1a0b9c8d",
			Index:        3,
			MemoryBytes:  4 << 30,
			Cores:        30,
			CDIDeviceIDs: []string{"vgpu.dra.dev/claim=" + uidA + "-gpu-gpu-0-7c2d9e1f", "nvidia.com/gpu=GPU-3b2a"},
		}},
	}
}

// writeCounter wraps the store's file writer, counts the writes and can hold the first one.
type writeCounter struct {
	mu     sync.Mutex
	writes int
	// beforeWrite, when set, runs before each write with the write's 1-based number; an error
	// it returns replaces the write.
	beforeWrite func(n int) error
}

func (c *writeCounter) install(s *Store) {
	s.write = func(path string, data []byte, perm os.FileMode) error {
		c.mu.Lock()
		c.writes++
		n := c.writes
		hook := c.beforeWrite
		c.mu.Unlock()
		if hook != nil {
			if err := hook(n); err != nil {
				return err
			}
		}
		return fsutil.WriteFileAtomic(path, data, perm)
	}
}

func (c *writeCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// waitQueued waits until n mutations wait for the next batch. It returns an error rather
// than failing the test because it also runs on a leader's goroutine (inside a write hook).
func waitQueued(s *Store, n int) error {
	return pollUntil(func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.queue) >= n
	})
}

// pollUntil polls cond every millisecond for up to 10 seconds.
func pollUntil(cond func() bool) error {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("condition not met after 10s")
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func openStore(t testing.TB, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	return s
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func dirEntries(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

func putClaim(uid string, c Claim) func(*Data) error {
	return func(d *Data) error {
		d.Claims[uid] = c
		return nil
	}
}

func checkpointPath(t testing.TB) string {
	return filepath.Join(t.TempDir(), contract.CheckpointFile)
}

// adminClaim is a claim of one adminAccess result on the NRI path: no limits (format v2).
func adminClaim() Claim {
	return Claim{
		Namespace: "monitoring", Name: "dcgm", State: PrepareCompleted, Path: contract.PathNRI,
		ReservedFor: []string{podY},
		Devices: []Device{{
			Request: "gpu", Pool: "node-1", Device: "gpu-0", ShareID: "4d3c2b1a-0a3b-4c5d-8e6f-1a2b3c4d5e6f",
			GPUUUID: "GPU-3b2a1c0d-9e8f-7a6b-5c4d-3e2f1a0b9c8d", Index: 3, AdminAccess: true,
			CDIDeviceIDs: []string{"vgpu.dra.dev/claim=" + uidB + "-gpu-gpu-0-4d3c2b1a", "vgpu.dra.dev/claim=" + uidB + "-common"},
		}},
	}
}
