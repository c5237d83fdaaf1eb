//go:build gpu

package gpu

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMIGOnGPU is the plugin's MIG code path on a real GPU (hack/gpu-check.sh; build tag gpu,
// never in CI): the layout of the GPU $GPU_CHECK_UUID, then its smallest profile created at its
// first free placement and destroyed again, timed. MIG mode is changed only with
// GPU_CHECK_MIG_MODE_CHANGE=1 (a lent machine's MIG settings are not ours to change) and is
// put back as it was; a GPU that cannot be partitioned, or whose mode cannot change, is a SKIP
// that says why.
func TestMIGOnGPU(t *testing.T) {
	uuid := os.Getenv("GPU_CHECK_UUID")
	if uuid == "" {
		t.Fatal("GPU_CHECK_UUID is not set")
	}
	src, err := NewNVML()
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	mig := src.(MIG)
	on, pending, err := mig.MIGMode(uuid)
	if err != nil {
		t.Skipf("SKIP MIG: the GPU reports no MIG mode: %v", err)
	}
	t.Logf("MIG mode: current %v, pending %v", on, pending)
	if !on {
		if os.Getenv("GPU_CHECK_MIG_MODE_CHANGE") != "1" {
			t.Skip("SKIP MIG: MIG mode is off, and changing it needs GPU_CHECK_MIG_MODE_CHANGE=1")
		}
		if err := mig.SetMIGMode(uuid, true); err != nil {
			t.Skipf("SKIP MIG: MIG mode cannot be turned on here: %v", err)
		}
		defer func() {
			if err := mig.SetMIGMode(uuid, false); err != nil {
				t.Errorf("MIG mode could not be put back off: %v", err)
			}
		}()
	}
	l, err := mig.MIGLayout(uuid)
	if errors.Is(err, ErrMIGNotSupported) {
		t.Skipf("SKIP MIG: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range l.Profiles {
		names = append(names, p.Name)
	}
	t.Logf("profiles: %s; %d slots, %d compute slices", strings.Join(names, " "), l.Slots, l.Slices)
	existing, err := mig.MIGInstances(uuid)
	if err != nil {
		t.Fatal(err)
	}
	smallest := l.Profiles[0]
	for _, at := range smallest.Placements {
		taken := false
		for _, in := range existing {
			taken = taken || in.Placement.Overlaps(at)
		}
		if taken {
			continue
		}
		start := time.Now()
		in, err := mig.CreateMIGInstance(uuid, smallest.ID, at)
		if err != nil {
			t.Fatalf("create %s at slot %d: %v", smallest.Name, at.Start, err)
		}
		created := time.Since(start)
		if !strings.HasPrefix(in.UUID, "MIG-") {
			t.Errorf("instance %+v has no MIG device", in)
		}
		start = time.Now()
		if err := mig.DestroyMIGInstance(uuid, in.GPUInstanceID); err != nil {
			t.Fatalf("destroy %s at slot %d: %v", smallest.Name, at.Start, err)
		}
		t.Logf("MIG %s at slot %d (%s): created in %v, destroyed in %v", smallest.Name, at.Start, in.UUID, created.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		return
	}
	t.Skipf("SKIP MIG: every placement of %s is taken", smallest.Name)
}
