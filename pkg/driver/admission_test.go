package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// TestConcurrentPreparesSeeEachOther: claims being prepared are not in the checkpoint until
// their files exist, yet the capacity check must count them. Ten claims of 30 % of one GPU's
// cores are prepared at once, and every claim that passes the check is held before its files
// and its record until every other claim has passed or been refused: exactly three fit.
func TestConcurrentPreparesSeeEachOther(t *testing.T) {
	var mu sync.Mutex
	held := 0
	release := make(chan struct{})
	d := newTestDriver(t, func(_ *Config, deps *Deps) {
		deps.AtStep = func(s Step) {
			if s != StepPrepareAdmitted {
				return
			}
			mu.Lock()
			held++
			mu.Unlock()
			<-release
		}
	})
	var claims []*resourceapi.ResourceClaim
	for i := range 10 {
		claims = append(claims, apiClaim(fmt.Sprintf("c%d", i), fmt.Sprintf("c1a10000-0000-4000-8000-%012d", i), result("gpu", "gpu-0", "1Gi", "30")))
	}
	results := make(chan map[string]error, 1)
	go func() {
		out := map[string]error{}
		for uid, err := range prepare(t, d, claims...) {
			out[string(uid)] = err
		}
		results <- out
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := held
		mu.Unlock()
		if n+int(d.metric(t, "vgpu_dra_prepare_errors_total", "reason", metrics.ReasonOvercommitted)) == len(claims) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d claims held after the check and %v refused, want all %d accounted for", n, d.metric(t, "vgpu_dra_prepare_errors_total", "reason", metrics.ReasonOvercommitted), len(claims))
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	prepared, refused := 0, 0
	for uid, err := range <-results {
		var pe *prepareError
		switch {
		case err == nil:
			prepared++
		case errors.As(err, &pe) && pe.reason == metrics.ReasonOvercommitted:
			refused++
		default:
			t.Errorf("claim %s: %v", uid, err)
		}
	}
	if prepared != 3 || refused != 7 {
		t.Errorf("%d prepared and %d refused as overcommitted, want 3 and 7", prepared, refused)
	}
	if n := d.deps.Checkpoint.Len(); n != 3 {
		t.Errorf("checkpoint holds %d claims, want 3", n)
	}
}

// TestFailedPrepareReleasesItsCapacity: a Prepare that fails after the capacity check (its CDI
// spec cannot be written) leaves neither files nor a claim on the GPU's capacity behind: a claim
// that fits only without it is prepared next.
func TestFailedPrepareReleasesItsCapacity(t *testing.T) {
	d := newTestDriver(t)
	a := apiClaim("a", uidClaimA, result("gpu", "gpu-0", "1Gi", "60"))
	specDir := filepath.Dir(d.deps.CDI.SpecPath(uidClaimA))
	if err := os.RemoveAll(specDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(specDir, []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := prepare(t, d, a)[a.UID]; err == nil || !strings.Contains(err.Error(), "CDI spec") {
		t.Fatalf("Prepare with an unusable spec directory: %v, want the CDI spec named", err)
	}
	if dir, _ := d.deps.Dirs.ClaimDir(uidClaimA); fileExists(dir) {
		t.Error("the failed claim's directory stays")
	}
	if err := os.Remove(specDir); err != nil {
		t.Fatal(err)
	}
	b := apiClaim("b", uidClaimB, result("gpu", "gpu-0", "1Gi", "60"))
	if err := prepare(t, d, b)[b.UID]; err != nil {
		t.Errorf("a claim that fits once the failed one is gone: %v", err)
	}
}

// TestARecordedClaimIsCountedOnce: between a claim's checkpoint record and the release of its
// admission, it is both in the checkpoint's totals and among the claims being prepared. A claim
// that fits next to it exactly must be admitted in that window: counted twice, it would be
// refused as overcommitted.
func TestARecordedClaimIsCountedOnce(t *testing.T) {
	recorded, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	d := newTestDriver(t, func(_ *Config, deps *Deps) {
		deps.AtStep = func(s Step) {
			if s == StepPrepareRecorded && held.CompareAndSwap(false, true) {
				close(recorded)
				<-release
			}
		}
	})
	a := apiClaim("a", uidClaimA, result("gpu", "gpu-0", "40Gi", "60"))
	b := apiClaim("b", uidClaimB, result("gpu", "gpu-0", "40Gi", "40"))
	first := make(chan error, 1)
	go func() { first <- prepare(t, d, a)[a.UID] }()
	<-recorded
	if err := prepare(t, d, b)[b.UID]; err != nil {
		t.Errorf("a claim that fits exactly next to one just recorded: %v", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}
