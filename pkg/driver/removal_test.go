package driver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// TestUnprepareLeavesTheDirectoryToTheBackground: Unprepare answers once the CDI spec and the
// record are gone; the claim directory goes in the background (WaitRemovals waits for it). A
// claim prepared again before that starts with a fresh directory — nothing of its earlier
// containers — and keeps it.
func TestUnprepareLeavesTheDirectoryToTheBackground(t *testing.T) {
	d := newTestDriver(t)
	ctx := context.Background()
	a := apiClaim("a", uidClaimA, result("gpu", "gpu-0", "1Gi", "10"))
	if err := prepare(t, d, a)[a.UID]; err != nil {
		t.Fatal(err)
	}
	dir, _ := d.deps.Dirs.ClaimDir(uidClaimA)
	old := filepath.Join(dir, "left-by-an-earlier-container")
	if err := os.Mkdir(old, 0o700); err != nil {
		t.Fatal(err)
	}
	unprepare := func() {
		t.Helper()
		res, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: a.UID}})
		if err != nil || res[a.UID] != nil {
			t.Fatalf("Unprepare: %v %v", err, res[a.UID])
		}
	}
	unprepare()
	if fileExists(d.deps.CDI.SpecPath(uidClaimA)) {
		t.Error("the CDI spec is left after Unprepare answered")
	}
	if _, ok := d.deps.Checkpoint.Get(uidClaimA); ok {
		t.Error("the record is left after Unprepare answered")
	}
	if !fileExists(dir) {
		t.Fatal("the directory is gone although nothing removed it yet (the background worker does not run here)")
	}

	// Prepared again before the removal ran: the old directory goes first.
	if err := prepare(t, d, a)[a.UID]; err != nil {
		t.Fatal(err)
	}
	if fileExists(old) {
		t.Error("the claim prepared again kept its earlier directory's content")
	}
	if err := d.WaitRemovals(ctx); err != nil {
		t.Fatal(err)
	}
	if !fileExists(dir) {
		t.Error("a removal queued before the claim was prepared again removed its new directory")
	}
	// A removal of a claim that is prepared is skipped.
	d.removals.add(uidClaimA)
	if err := d.WaitRemovals(ctx); err != nil {
		t.Fatal(err)
	}
	if !fileExists(dir) {
		t.Error("the directory of a prepared claim was removed")
	}

	unprepare()
	if err := d.WaitRemovals(ctx); err != nil {
		t.Fatal(err)
	}
	if fileExists(dir) {
		t.Error("the directory is left once the removals are done")
	}
}
