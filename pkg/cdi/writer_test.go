package cdi

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

func TestWriteFile(t *testing.T) {
	w := newTestWriter(t, nil)
	c := nriClaim(gpu0Result())
	if err := w.Write(c); err != nil {
		t.Fatalf("Write: %v", err)
	}
	path := w.SpecPath(claimUID)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", fi.Mode().Perm())
	}
	if got := specFiles(t, w.opts.SpecDir); !slices.Equal(got, []string{"vgpu.dra.dev-claim_" + claimUID + ".json"}) {
		t.Errorf("spec dir holds %q, want only the spec (no temporary files)", got)
	}
	spec, err := cdiapi.ReadSpec(path, 0)
	if err != nil {
		t.Fatalf("CDI library cannot read the spec: %v", err)
	}
	if spec.Version != "0.5.0" || spec.Kind != qualifiedKind || spec.GetDevice(commonName) == nil {
		t.Errorf("read back version %q kind %q devices %v", spec.Version, spec.Kind, spec.Devices)
	}
	if min, _ := cdispec.MinimumRequiredVersion(spec.Spec); min != "0.5.0" {
		t.Errorf("minimum required version %q, want 0.5.0 (the version written)", min)
	}
	if ok, err := w.Exists(claimUID); err != nil || !ok {
		t.Errorf("Exists = %v, %v; want true", ok, err)
	}
}

func TestWriteIsIdempotent(t *testing.T) {
	w := newTestWriter(t, nil)
	c := perClaimClaim(gpu0Result(), gpu3Result())
	if err := w.Write(c); err != nil {
		t.Fatal(err)
	}
	path := w.SpecPath(claimUID)
	first, _ := os.ReadFile(path)
	before, _ := os.Stat(path)

	if err := w.Write(c); err != nil {
		t.Fatalf("re-Write: %v", err)
	}
	second, _ := os.ReadFile(path)
	after, _ := os.Stat(path)
	if !bytes.Equal(first, second) {
		t.Error("re-write of an unchanged claim changed the bytes")
	}
	if !os.SameFile(before, after) {
		t.Error("re-write of an unchanged claim replaced the file; want it skipped")
	}

	// A fresh Writer (plugin restart) produces the same bytes too.
	w2, err := NewWriter(w.opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.Write(c); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Stat(path); !os.SameFile(before, again) {
		t.Error("re-write after restart replaced an identical file")
	}

	// A changed claim replaces the file.
	c.Results[0].MemoryBytes = 2 << 30
	if err := w.Write(c); err != nil {
		t.Fatal(err)
	}
	changed, _ := os.ReadFile(path)
	if !bytes.Contains(changed, []byte(`"CUDA_MEM_LIMIT_0=2048m"`)) {
		t.Errorf("changed claim not written:\n%s", changed)
	}
}

func TestWriteCreatesMissingSpecDir(t *testing.T) {
	w := newTestWriter(t, func(o *Options) { o.SpecDir += "/sub/dir" })
	if err := w.Write(nriClaim(gpu0Result())); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if ok, _ := w.Exists(claimUID); !ok {
		t.Error("spec not written")
	}
}

func TestRemove(t *testing.T) {
	w := newTestWriter(t, nil)
	if err := w.Remove(claimUID); err != nil {
		t.Errorf("Remove of a missing spec (no dir): %v", err)
	}
	if err := w.Write(nriClaim(gpu0Result())); err != nil {
		t.Fatal(err)
	}
	if err := w.Remove(claimUID); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if ok, err := w.Exists(claimUID); err != nil || ok {
		t.Errorf("Exists after Remove = %v, %v", ok, err)
	}
	if err := w.Remove(claimUID); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

func TestInvalidClaimUIDTouchesNoPath(t *testing.T) {
	w := newTestWriter(t, nil)
	for _, uid := range []string{"", "../../../etc/x", "0B9D3F2E-6A7C-4F21-9E0D-3C5B7A1F8E42", "0b9d3f2e6a7c4f219e0d3c5b7a1f8e42", claimUID + "0", "0b9d3f2e-6a7c-4f21-9e0d-3c5b7a1f8e4g"} {
		t.Run(fmt.Sprintf("%q", uid), func(t *testing.T) {
			c := nriClaim(gpu0Result())
			c.UID = uid
			if err := w.Write(c); !errors.Is(err, ErrInvalidClaim) {
				t.Errorf("Write: %v, want ErrInvalidClaim", err)
			}
			if err := w.Remove(uid); !errors.Is(err, ErrInvalidClaim) {
				t.Errorf("Remove: %v, want ErrInvalidClaim", err)
			}
			if _, err := w.Exists(uid); !errors.Is(err, ErrInvalidClaim) {
				t.Errorf("Exists: %v, want ErrInvalidClaim", err)
			}
		})
	}
	if got := specFiles(t, w.opts.SpecDir); len(got) != 0 {
		t.Errorf("spec dir holds %q", got)
	}
}

// refuseAll is an external spec validator (cdi.SetSpecValidator) that refuses everything.
type refuseAll struct{}

func (refuseAll) Validate(*cdispec.Spec) error { return errors.New("refused by test validator") }

// What the CDI loader refuses is never renamed into place, and leaves no temporary file.
func TestWriteRefusedByLoaderLeavesNothing(t *testing.T) {
	cdiapi.SetSpecValidator(refuseAll{})
	t.Cleanup(func() { cdiapi.SetSpecValidator(nil) })
	w := newTestWriter(t, nil)
	if err := w.Write(nriClaim(gpu0Result())); err == nil {
		t.Fatal("Write succeeded with a refusing loader")
	}
	if got := specFiles(t, w.opts.SpecDir); len(got) != 0 {
		t.Errorf("spec dir holds %q after a refused write", got)
	}
}

func TestConcurrentWrites(t *testing.T) {
	w := newTestWriter(t, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 32 {
		wg.Go(func() {
			c := nriClaim(gpu0Result())
			c.UID = fmt.Sprintf("00000000-0000-4000-8000-%012d", i%8) // four writers per claim
			c.Results[0].Cores = int64(1 + i%8)
			errs <- w.Write(c)
			errs <- w.Remove(fmt.Sprintf("00000000-0000-4000-8000-%012d", 100+i))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := specFiles(t, w.opts.SpecDir); len(got) != 8 {
		t.Errorf("spec dir holds %d files, want 8: %q", len(got), got)
	}
	if _, err := cdiapi.NewCache(cdiapi.WithSpecDirs(w.opts.SpecDir), cdiapi.WithAutoRefresh(false)); err != nil {
		t.Fatal(err)
	}
}

// TestNewWriterRemovesStaleTemps: temporary specs a crash left between write and rename are
// removed when the next process starts; other files in the directory are not touched.
func TestNewWriterRemovesStaleTemps(t *testing.T) {
	o := testOptions(t)
	if err := os.MkdirAll(o.SpecDir, 0o755); err != nil {
		t.Fatal(err)
	}
	stale := []string{
		filepath.Join(o.SpecDir, "."+testDriver+"-claim_"+claimUID+".json.123456.tmp"),
		filepath.Join(o.SpecDir, "."+testDriver+"-share.json.654321.tmp"), // the device plugin's
	}
	keep := []string{
		filepath.Join(o.SpecDir, testDriver+"-share.json"),
		filepath.Join(o.SpecDir, "."+"other.vendor-claim_"+claimUID+".json.1.tmp"), // another driver's
		filepath.Join(o.SpecDir, testDriver+"-claim_"+claimUID2+".json"),           // a spec
		filepath.Join(o.SpecDir, "nvidia.yaml"),
	}
	for _, p := range append(keep, stale...) {
		if err := os.WriteFile(p, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := NewWriter(o); err != nil {
		t.Fatal(err)
	}
	for _, p := range stale {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("stale temporary spec %s still there: %v", p, err)
		}
	}
	for _, p := range keep {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was touched: %v", p, err)
		}
	}
}
