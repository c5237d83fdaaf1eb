package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOneBadClaimIsQuarantined: a prepared claim whose files cannot be restored at start-up no
// longer stops the plugin (which made every claim of the node wait on a crash-looping pod). It
// is quarantined and counted; the other claims are served; its Prepare and its containers fail
// with the reason; once the cause is gone, a Prepare restores it.
func TestOneBadClaimIsQuarantined(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	good := n.newClaim("good", allocated{request: "gpu", device: "gpu-0", memory: "4Gi", cores: 30, shareID: shareN1})
	bad := n.newClaim("bad", allocated{request: "gpu", device: "gpu-1", memory: "4Gi", cores: 30, shareID: shareN2})
	k.prepare(t, good, bad)
	badResp := k.prepare(t, bad)[string(bad.UID)]
	n.stop()

	// Something (a person, a broken disk) left a file where the claim's directory belongs.
	badDir := n.claimDir(string(bad.UID))
	if err := unix.Unmount(badDir, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(badDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(badDir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	n.start()
	if got := metricValue(t, n, "vgpu_dra_quarantined_claims"); got != 1 {
		t.Errorf("quarantined_claims = %v, want 1", got)
	}
	k = n.register()
	if r := k.prepare(t, good)[string(good.UID)]; r.Error != "" {
		t.Errorf("Prepare of the healthy claim: %s", r.Error)
	}
	if r := k.prepare(t, bad)[string(bad.UID)]; !strings.Contains(r.Error, "not a directory") {
		t.Errorf("Prepare of the quarantined claim: %q, want the reason", r.Error)
	}
	n.waitSession(1)
	ctx := t.Context()
	pod := podOf(bad)
	if err := n.nri.runPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := n.nri.create(ctx, pod.Id, n.vgpuContainer("c-bad", "app", badResp, string(bad.UID))); err == nil || !strings.Contains(err.Error(), "could not be restored") {
		t.Errorf("a container of the quarantined claim: %v, want it failed with the reason", err)
	}

	if err := os.Remove(badDir); err != nil {
		t.Fatal(err)
	}
	if r := k.prepare(t, bad)[string(bad.UID)]; r.Error != "" {
		t.Fatalf("Prepare once the cause is gone: %s", r.Error)
	}
	if got := metricValue(t, n, "vgpu_dra_quarantined_claims"); got != 0 {
		t.Errorf("quarantined_claims = %v after the claim was restored, want 0", got)
	}
	if _, err := n.nri.create(ctx, pod.Id, n.vgpuContainer("c-bad-2", "app", badResp, string(bad.UID))); err != nil {
		t.Errorf("a container of the restored claim: %v", err)
	}
}

// TestFailedPrepareRollsBack: a Prepare that fails half-way (the CDI dir is full) leaves
// nothing: no checkpoint entry in PrepareStarted, no claim directory, no tmpfs.
func TestFailedPrepareRollsBack(t *testing.T) {
	n := newNode(t)
	if err := os.MkdirAll(n.cfg.CDIDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", n.cfg.CDIDir, "tmpfs", 0, "size=8k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(n.cfg.CDIDir, unix.MNT_DETACH) })
	filler, err := os.Create(filepath.Join(n.cfg.CDIDir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = filler.Write(make([]byte, 1024))
	}
	filler.Close()
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "4Gi", cores: 30, shareID: shareN1})
	if r := k.prepare(t, a)[string(a.UID)]; !strings.Contains(r.Error, "no space left") {
		t.Fatalf("Prepare on a full CDI dir: %q, want ENOSPC named", r.Error)
	}
	if c, ok := n.readCheckpoint().Claims[string(a.UID)]; ok {
		t.Errorf("the failed claim stays in the checkpoint as %s", c.State)
	}
	if exists(n.claimDir(string(a.UID))) {
		t.Error("the failed claim's directory stays")
	}
	if m := mountsUnder(t, n.cfg.StateDir); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
	// Space again: the kubelet's retry prepares it from scratch.
	if err := os.Remove(filepath.Join(n.cfg.CDIDir, "filler")); err != nil {
		t.Fatal(err)
	}
	if r := k.prepare(t, a)[string(a.UID)]; r.Error != "" {
		t.Errorf("retry: %s", r.Error)
	}
}
