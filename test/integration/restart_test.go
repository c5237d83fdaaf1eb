package integration

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"golang.org/x/sys/unix"
)

// TestRestartBetweenPrepareAndUnprepare: a new plugin process prepares the same claim to the
// same result (kubelet retries after a restart) and unprepares what the first one prepared.
func TestRestartBetweenPrepareAndUnprepare(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "2Gi", cores: 10, shareID: shareA})
	first := k.prepare(t, a)[string(a.UID)]
	specBefore, err := os.ReadFile(n.specPath(string(a.UID)))
	if err != nil {
		t.Fatal(err)
	}

	n.restart()
	k = n.register()
	if got := gaugeValue(t, n, "vgpu_dra_prepared_claims"); got != 1 {
		t.Errorf("prepared_claims after restart = %v, want 1", got)
	}
	again := k.prepare(t, a)[string(a.UID)]
	if again.Error != "" || !slices.Equal(again.Devices[0].CdiDeviceIds, first.Devices[0].CdiDeviceIds) {
		t.Errorf("prepare after restart = %v, want the first result %v", again, first)
	}
	specAfter, _ := os.ReadFile(n.specPath(string(a.UID)))
	if string(specAfter) != string(specBefore) {
		t.Error("CDI spec changed across a restart")
	}

	n.restart()
	k = n.register()
	k.unprepare(t, a)
	if exists(n.specPath(string(a.UID))) || exists(n.claimDir(string(a.UID))) || len(n.readCheckpoint().Claims) != 0 {
		t.Error("unprepare after restart left state behind")
	}
}

// TestRebootRecreatesCDISpecs: /var/run/cdi is tmpfs. After a reboot the specs of prepared
// claims must be back before the kubelet starts containers — at start-up, and again by a
// Prepare that finds them missing (kubernetes issue 141433).
func TestRebootRecreatesCDISpecs(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "2Gi", cores: 10, shareID: shareA})
	b := n.newClaim("b", allocated{request: "gpu", device: "gpu-1"})
	k.prepare(t, a, b)
	want, _ := os.ReadFile(n.specPath(string(a.UID)))

	n.stop()
	if err := os.RemoveAll(n.cfg.CDIDir); err != nil { // the reboot empties the tmpfs
		t.Fatal(err)
	}
	n.bootID = "boot-2"
	n.start()
	for _, c := range []string{string(a.UID), string(b.UID)} {
		if !exists(n.specPath(c)) {
			t.Errorf("CDI spec of claim %s not re-created at start-up", c)
		}
	}
	got, _ := os.ReadFile(n.specPath(string(a.UID)))
	if string(got) != string(want) {
		t.Errorf("re-created spec differs from the original")
	}
	if id := n.readCheckpoint().BootID; id != "boot-2" {
		t.Errorf("checkpoint bootID = %q after reboot", id)
	}

	// The kubelet prepares again after a reboot; a spec missing by then is re-created too.
	k = n.register()
	if err := os.Remove(n.specPath(string(b.UID))); err != nil {
		t.Fatal(err)
	}
	// A reboot loses the claim's tmpfs with everything on it.
	for _, m := range mountsUnder(t, n.claimDir(string(b.UID))) {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Unmount(n.claimDir(string(b.UID)), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(n.claimDir(string(b.UID))); err != nil {
		t.Fatal(err)
	}
	r := k.prepare(t, b)[string(b.UID)]
	if r.Error != "" || !exists(n.specPath(string(b.UID))) || !exists(n.claimDir(string(b.UID))) || !isTmpfs(t, n.claimDir(string(b.UID))) {
		t.Errorf("Prepare of a checkpointed claim did not re-create its files and tmpfs: %v", r)
	}
}

// TestCorruptCheckpointIsAClearError: a damaged checkpoint stops start-up with an error naming
// the file; it is never silently reset (that would forget prepared claims).
func TestCorruptCheckpointIsAClearError(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "2Gi", cores: 10, shareID: shareA})
	k.prepare(t, a)
	n.stop()

	path := filepath.Join(n.cfg.KubeletDir, "plugins", driverName, "checkpoint.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(b), `"gpu-0"`)
	b[i+5] = '7' // gpu-0 → gpu-7 inside data: the checksum no longer matches
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	err = n.tryStart()
	var corrupt *checkpoint.CorruptError
	if !errors.As(err, &corrupt) || !strings.Contains(err.Error(), path) {
		t.Fatalf("start with a corrupt checkpoint: %v, want a CorruptError naming %s", err, path)
	}
	after, _ := os.ReadFile(path)
	if string(after) != string(b) {
		t.Error("the corrupt checkpoint was rewritten")
	}
}

// TestCrashDuringPrepareIsRolledBack: a claim left in PrepareStarted (the process died between
// the checkpoint entry and the files) is rolled back at start-up; the kubelet's retry then
// prepares it from scratch.
func TestCrashDuringPrepareIsRolledBack(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "2Gi", cores: 10, shareID: shareA})
	k.prepare(t, a)
	n.stop()

	// Put the store back to "started", as a crash right after the first checkpoint write would
	// leave it, with a half-written spec.
	store, err := checkpoint.Open(filepath.Join(n.cfg.KubeletDir, "plugins", driverName, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Update(func(d *checkpoint.Data) error {
		c := d.Claims[string(a.UID)]
		c.State = checkpoint.PrepareStarted
		d.Claims[string(a.UID)] = c
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.specPath(string(a.UID)), []byte(`{"cdiVersion":`), 0o644); err != nil {
		t.Fatal(err)
	}
	n.start()
	if exists(n.specPath(string(a.UID))) || exists(n.claimDir(string(a.UID))) {
		t.Error("a claim whose Prepare did not complete kept files after start-up")
	}
	if _, ok := n.readCheckpoint().Claims[string(a.UID)]; ok {
		t.Error("a claim whose Prepare did not complete is still in the checkpoint")
	}
	k = n.register()
	if r := k.prepare(t, a)[string(a.UID)]; r.Error != "" || !exists(n.specPath(string(a.UID))) {
		t.Errorf("retry after rollback: %v", r)
	}
	if n.readCheckpoint().Claims[string(a.UID)].State != checkpoint.PrepareCompleted {
		t.Error("retry did not complete the claim")
	}
}

// TestNewerCheckpointIsRefused: a checkpoint of a newer format (a plugin rolled back past a
// format change) stops start-up with an error naming the format and the build that wrote it;
// the file is left for that build to read.
func TestNewerCheckpointIsRefused(t *testing.T) {
	n := newNode(t)
	path := filepath.Join(n.cfg.KubeletDir, "plugins", driverName, "checkpoint.json")
	newer, err := os.ReadFile(filepath.Join("..", "..", "pkg", "checkpoint", "testdata", "checkpoint-v3.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, newer, 0o600); err != nil {
		t.Fatal(err)
	}
	err = n.tryStart()
	var ve *checkpoint.VersionError
	if !errors.As(err, &ve) {
		t.Fatalf("start with a v3 checkpoint: %v, want a VersionError", err)
	}
	for _, want := range []string{path, "format v3", "vgpu-dra v0.9.0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if after, _ := os.ReadFile(path); string(after) != string(newer) {
		t.Error("the newer checkpoint was rewritten")
	}
}
