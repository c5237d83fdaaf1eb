package checkpoint

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSealWaitsForTheBatchInFlightThenRefuses: the handover's fence (contract §14). Seal returns
// only once the batch being written is on disk; every Update after it fails with ErrSealed and
// leaves the file as it is; Unseal lets writes through again.
func TestSealWaitsForTheBatchInFlightThenRefuses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	s := openStore(t, path)
	var wc writeCounter
	release := make(chan struct{})
	wc.beforeWrite = func(n int) error {
		if n == 1 {
			<-release
		}
		return nil
	}
	wc.install(s)
	firstDone := make(chan error, 1)
	go func() {
		firstDone <- s.Update(func(d *Data) error { d.Claims[uidA] = fullClaim(); return nil })
	}()
	if err := pollUntil(func() bool { return wc.count() == 1 }); err != nil {
		t.Fatal(err)
	}
	sealed := make(chan error, 1)
	go func() { sealed <- s.Seal(context.Background()) }()
	select {
	case err := <-sealed:
		t.Fatalf("Seal returned (%v) while a batch was still being written", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatalf("the update in flight when Seal was called: %v", err)
	}
	if err := <-sealed; err != nil {
		t.Fatalf("Seal: %v", err)
	}
	before := readFile(t, path)
	err := s.Update(func(d *Data) error { delete(d.Claims, uidA); return nil })
	if !errors.Is(err, ErrSealed) {
		t.Fatalf("Update after Seal = %v, want ErrSealed", err)
	}
	if string(readFile(t, path)) != string(before) {
		t.Error("a sealed store changed the file")
	}
	s.Unseal()
	if err := s.Update(func(d *Data) error { delete(d.Claims, uidA); return nil }); err != nil {
		t.Fatalf("Update after Unseal: %v", err)
	}
	if got, _ := Load(path); len(got.Claims) != 0 {
		t.Errorf("the file after Unseal holds %d claims, want 0", len(got.Claims))
	}
}

// TestSealGivesUpAtItsDeadline: a write that does not finish in time calls the handover off;
// the store stays writable.
func TestSealGivesUpAtItsDeadline(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "checkpoint.json"))
	var wc writeCounter
	release := make(chan struct{})
	wc.beforeWrite = func(int) error { <-release; return nil }
	wc.install(s)
	done := make(chan error, 1)
	go func() { done <- s.Update(func(d *Data) error { d.BootID = "b"; return nil }) }()
	if err := pollUntil(func() bool { return wc.count() == 1 }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Seal(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Seal past its deadline = %v, want DeadlineExceeded", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(d *Data) error { d.BootID = "c"; return nil }); err != nil {
		t.Errorf("Update after a Seal that gave up: %v", err)
	}
}

// TestLoadReadsWithoutTakingOver: Load checks the file as Open does but leaves a temporary file
// (the owner's write in progress) alone, and reports a newer format as *VersionError.
func TestLoadReadsWithoutTakingOver(t *testing.T) {
	path := copyFixture(t, "checkpoint-v2.json")
	temp := filepath.Join(filepath.Dir(path), ".checkpoint.json.tmp-123")
	if err := os.WriteFile(temp, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := Load(path)
	if err != nil || len(d.Claims) != 2 {
		t.Fatalf("Load = %d claims, %v; want the fixture's 2", len(d.Claims), err)
	}
	if _, err := os.Stat(temp); err != nil {
		t.Errorf("Load removed another writer's temporary file: %v", err)
	}
	var ve *VersionError
	if _, err := Load(copyFixture(t, "checkpoint-v3.json")); !errors.As(err, &ve) || ve.Version != "v3" {
		t.Errorf("Load of a v3 file = %v, want a *VersionError naming v3", err)
	}
	if d, err := Load(filepath.Join(t.TempDir(), "missing.json")); err != nil || len(d.Claims) != 0 {
		t.Errorf("Load of a missing file = %+v, %v; want an empty checkpoint", d, err)
	}
}
