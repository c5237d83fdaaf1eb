package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

func TestOpen(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, dir string) string // returns the checkpoint path
		wantErr error                                 // nil: Open succeeds with empty data
	}{
		{
			name:  "missing file is empty",
			setup: func(t *testing.T, dir string) string { return filepath.Join(dir, contract.CheckpointFile) },
		},
		{
			name: "stale temporary files are removed",
			setup: func(t *testing.T, dir string) string {
				if err := os.WriteFile(filepath.Join(dir, ".checkpoint.json.tmp-42"), []byte("{"), 0o600); err != nil {
					t.Fatal(err)
				}
				return filepath.Join(dir, contract.CheckpointFile)
			},
		},
		{
			name:    "directory missing",
			setup:   func(t *testing.T, dir string) string { return filepath.Join(dir, "nope", contract.CheckpointFile) },
			wantErr: fs.ErrNotExist,
		},
		{
			name: "directory is a file",
			setup: func(t *testing.T, dir string) string {
				f := filepath.Join(dir, "file")
				if err := os.WriteFile(f, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				return filepath.Join(f, contract.CheckpointFile)
			},
			wantErr: syscall.ENOTDIR,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tt.setup(t, dir)
			s, err := Open(path)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Open = %v, want %v", err, tt.wantErr)
				}
				if parent := filepath.Dir(path); !strings.Contains(err.Error(), parent) {
					t.Errorf("error %q does not name the directory %s", err, parent)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if got := s.Snapshot(); got.BootID != "" || got.Claims == nil || len(got.Claims) != 0 {
				t.Errorf("Snapshot = %#v, want empty data with a non-nil map", got)
			}
			if got := dirEntries(t, dir); len(got) != 0 {
				t.Errorf("directory holds %v after Open, want nothing", got)
			}
		})
	}
}

func TestUpdateWritesDurableState(t *testing.T) {
	path := checkpointPath(t)
	s := openStore(t, path)
	var wc writeCounter
	wc.install(s)
	steps := []struct {
		name   string
		mutate func(*Data) error
		want   map[string]Claim
	}{
		{"add A", putClaim(uidA, Claim{Name: "a", State: PrepareStarted, Path: contract.PathNRI}),
			map[string]Claim{uidA: {Name: "a", State: PrepareStarted, Path: contract.PathNRI}}},
		{"add B", putClaim(uidB, fullClaim()),
			map[string]Claim{uidA: {Name: "a", State: PrepareStarted, Path: contract.PathNRI}, uidB: fullClaim()}},
		{"complete A", func(d *Data) error {
			c := d.Claims[uidA]
			c.State = PrepareCompleted
			d.Claims[uidA] = c
			return nil
		}, map[string]Claim{uidA: {Name: "a", State: PrepareCompleted, Path: contract.PathNRI}, uidB: fullClaim()}},
		{"remove B", func(d *Data) error { delete(d.Claims, uidB); return nil },
			map[string]Claim{uidA: {Name: "a", State: PrepareCompleted, Path: contract.PathNRI}}},
		{"nil map is written as empty", func(d *Data) error { d.Claims = nil; return nil }, map[string]Claim{}},
	}
	for _, st := range steps {
		if err := s.Update(st.mutate); err != nil {
			t.Fatalf("%s: Update: %v", st.name, err)
		}
		if got := s.Snapshot().Claims; !reflect.DeepEqual(got, st.want) {
			t.Errorf("%s: Snapshot = %+v, want %+v", st.name, got, st.want)
		}
		if got := openStore(t, path).Snapshot().Claims; !reflect.DeepEqual(got, st.want) {
			t.Errorf("%s: file holds %+v, want %+v", st.name, got, st.want)
		}
	}
	if got, want := wc.count(), len(steps); got != want {
		t.Errorf("%d writes, want %d", got, want)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("checkpoint mode %v, want 0600", fi.Mode().Perm())
	}
	if got := dirEntries(t, filepath.Dir(path)); !slices.Equal(got, []string{contract.CheckpointFile}) {
		t.Errorf("directory holds %v, want only the checkpoint", got)
	}
}

func TestGetAndSnapshotReturnCopies(t *testing.T) {
	s := openStore(t, checkpointPath(t))
	if err := s.Update(putClaim(uidA, fullClaim())); err != nil {
		t.Fatal(err)
	}
	c, ok := s.Get(uidA)
	if !ok || !reflect.DeepEqual(c, fullClaim()) {
		t.Fatalf("Get = %+v, %v; want the full claim", c, ok)
	}
	c.ReservedFor[0] = "changed"
	snap := s.Snapshot()
	snap.Claims[uidA].Devices[0].CDIDeviceIDs[0] = "changed"
	delete(snap.Claims, uidA)
	if c, _ := s.Get(uidA); !reflect.DeepEqual(c, fullClaim()) {
		t.Errorf("changing returned copies changed the store: %+v", c)
	}
	if _, ok := s.Get(uidB); ok {
		t.Error("Get of an unknown claim reported it present")
	}
	if n := s.Len(); n != 1 {
		t.Errorf("Len = %d after deleting from a snapshot, want the 1 durable claim", n)
	}
}

func TestUpdateSkipsUnchangedAndFailedBatches(t *testing.T) {
	path := checkpointPath(t)
	s := openStore(t, path)
	var wc writeCounter
	wc.install(s)
	errNo := errors.New("no")
	if err := s.Update(func(d *Data) error { d.BootID = "x"; return errNo }); !errors.Is(err, errNo) {
		t.Fatalf("failing mutation: Update = %v, want %v", err, errNo)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a batch of failed mutations created the file (stat: %v)", err)
	}
	for range 3 {
		if err := s.Update(putClaim(uidA, fullClaim())); err != nil {
			t.Fatal(err)
		}
	}
	if got := wc.count(); got != 1 {
		t.Errorf("%d writes for one change repeated three times, want 1", got)
	}
}

// TestConcurrentUpdatesCoalesce holds the first write until 199 more callers wait, so the
// batching is deterministic: one write for the first caller, one for all the others.
func TestConcurrentUpdatesCoalesce(t *testing.T) {
	const callers = 200
	path := checkpointPath(t)
	s := openStore(t, path)
	var wc writeCounter
	wc.install(s)
	wc.beforeWrite = func(n int) error {
		if n == 1 {
			return waitQueued(s, callers-1)
		}
		return nil
	}
	uids := runConcurrentUpdates(t, s, callers)
	if got := wc.count(); got != 2 {
		t.Errorf("%d writes for %d concurrent updates, want 2", got, callers)
	}
	assertClaims(t, path, uids)
}

// TestConcurrentUpdatesUngated lets the scheduler decide the batches.
func TestConcurrentUpdatesUngated(t *testing.T) {
	const callers = 200
	path := checkpointPath(t)
	s := openStore(t, path)
	var wc writeCounter
	wc.install(s)
	uids := runConcurrentUpdates(t, s, callers)
	if got := wc.count(); got >= callers {
		t.Errorf("%d writes for %d concurrent updates, want fewer", got, callers)
	}
	t.Logf("%d writes for %d concurrent updates", wc.count(), callers)
	assertClaims(t, path, uids)
}

func runConcurrentUpdates(t *testing.T, s *Store, n int) []string {
	t.Helper()
	uids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		uids[i] = fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		wg.Go(func() {
			errs[i] = s.Update(putClaim(uids[i], Claim{Name: fmt.Sprintf("c%d", i), State: PrepareStarted}))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Update %d: %v", i, err)
		}
	}
	return uids
}

// assertClaims checks that both the store at path, reopened, and the file hold exactly uids.
func assertClaims(t *testing.T, path string, uids []string) {
	t.Helper()
	got := openStore(t, path).Snapshot().Claims
	if len(got) != len(uids) {
		t.Errorf("file holds %d claims, want %d", len(got), len(uids))
	}
	for _, uid := range uids {
		if _, ok := got[uid]; !ok {
			t.Errorf("claim %s missing from the file", uid)
		}
	}
}

// TestSetReservedFor: the one writer of reservedFor writes only a change, keeps it across a
// reopen, and names an unknown claim.
func TestSetReservedFor(t *testing.T) {
	path := checkpointPath(t)
	s := openStore(t, path)
	if err := s.Update(putClaim(uidA, fullClaim())); err != nil {
		t.Fatal(err)
	}
	var wc writeCounter
	wc.install(s)
	if err := s.SetReservedFor(uidA, []string{podX, podY}); err != nil {
		t.Fatalf("unchanged list: %v", err)
	}
	if n := wc.count(); n != 0 {
		t.Errorf("%d writes for an unchanged reservedFor, want 0", n)
	}
	if err := s.SetReservedFor(uidA, []string{podY}); err != nil {
		t.Fatalf("changed list: %v", err)
	}
	if c, _ := openStore(t, path).Get(uidA); !slices.Equal(c.ReservedFor, []string{podY}) {
		t.Errorf("file holds reservedFor %v, want [%s]", c.ReservedFor, podY)
	}
	if err := s.SetReservedFor(uidB, []string{podX}); !errors.Is(err, ErrNotPrepared) || !strings.Contains(err.Error(), uidB) {
		t.Errorf("unknown claim: err = %v, want ErrNotPrepared naming %s", err, uidB)
	}
}

// TestFind returns a copy of the match and reports a miss.
func TestFind(t *testing.T) {
	s := openStore(t, checkpointPath(t))
	b := fullClaim()
	b.RegisterUUID = "6c2f1d4e-3b5a-4c7d-9e8f-0a1b2c3d4e5f"
	for uid, c := range map[string]Claim{uidA: fullClaim(), uidB: b} {
		if err := s.Update(putClaim(uid, c)); err != nil {
			t.Fatal(err)
		}
	}
	uid, c, ok := s.Find(func(_ string, c *Claim) bool { return c.RegisterUUID == b.RegisterUUID })
	if !ok || uid != uidB || !reflect.DeepEqual(c, b) {
		t.Fatalf("Find = %s, %+v, %v; want %s and its claim", uid, c, ok, uidB)
	}
	c.Devices[0].GPUUUID = "changed"
	if got, _ := s.Get(uidB); !reflect.DeepEqual(got, b) {
		t.Error("changing Find's result changed the store")
	}
	if _, _, ok := s.Find(func(string, *Claim) bool { return false }); ok {
		t.Error("Find reported a match when nothing matched")
	}
}
