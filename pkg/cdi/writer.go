package cdi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	specFileMode = 0o644
	specDirMode  = 0o755
)

// Writer writes and removes the per-claim CDI specs of one driver. It holds no mutable state
// and is safe for concurrent use; concurrent writes of one claim each land whole (last rename
// wins) because every write goes through its own temporary file.
type Writer struct {
	opts      Options
	gpuVendor string // of GPUCDIKind; empty when unset
	gpuClass  string
	// checkSpec has the CDI library's validators check a built spec: validateSpec, which tests
	// replace to see a refusal through.
	checkSpec func(*cdispec.Spec) error
}

// NewWriter checks o and returns a Writer for it. It creates the spec directory when missing
// and removes the temporary files a crash left in it.
func NewWriter(o Options) (*Writer, error) {
	vendor, class, err := o.validate()
	if err != nil {
		return nil, err
	}
	// The runtime reads the directory, the plugin only writes to it: create it when missing
	// (/var/run/cdi is on tmpfs), so that an unusable --cdi-dir shows at start-up, not at the
	// first Prepare.
	if err := os.MkdirAll(o.SpecDir, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI spec directory: %w", err)
	}
	if err := removeStaleTemps(o.SpecDir, o.DriverName); err != nil {
		return nil, err
	}
	return &Writer{opts: o, gpuVendor: vendor, gpuClass: class, checkSpec: validateSpec}, nil
}

// Write builds the claim's spec, has the CDI library's validators accept it (validateSpec), and
// puts it in place atomically (temporary file, rename; mode 0644). It is idempotent, as it must be: the kubelet
// retries Prepare and the plugin re-creates specs at start-up. When the file already holds the
// identical bytes, nothing is written. Cost is O(1) in the number of specs in the directory.
//
// There is no fsync: the rename makes the spec whole or absent for every reader and after a
// crash of the process, and what a power loss could take is re-created anyway — the spec
// directory is a tmpfs on real nodes (/var/run/cdi), and start-up recovery re-writes the spec of
// every claim the checkpoint holds (contract §3, §7). An fsync here held one OS thread per claim
// of a burst for a millisecond each.
func (w *Writer) Write(c Claim) error {
	if err := w.validate(&c); err != nil {
		return err
	}
	spec := w.buildSpec(&c)
	if err := w.checkSpec(spec); err != nil {
		return fmt.Errorf("write CDI spec for claim %s: the CDI library refuses the spec: %w", c.UID, err)
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode CDI spec for claim %s: %w", c.UID, err)
	}
	data = append(data, '\n')

	path := w.SpecPath(c.UID)
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	if err := writeValidated(path, data); err != nil {
		return fmt.Errorf("write CDI spec for claim %s: %w", c.UID, err)
	}
	return nil
}

// writeValidated writes data to a temporary file next to path and renames it over path (no
// fsync: see Write). The temporary name ends in ".tmp", which CDI caches (the runtime's
// included) do not scan, so they never see a partial spec.
func writeValidated(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	pattern := "." + filepath.Base(path) + ".*.tmp"
	f, err := os.CreateTemp(dir, pattern)
	if errors.Is(err, fs.ErrNotExist) {
		// The spec dir is a tmpfs: after a reboot it may not exist yet.
		if err := os.MkdirAll(dir, specDirMode); err != nil {
			return fmt.Errorf("create spec dir: %w", err)
		}
		f, err = os.CreateTemp(dir, pattern)
	}
	if err != nil {
		return fmt.Errorf("create temporary file: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if err := writeAndClose(f, data); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename into place: %w", err)
	}
	return nil
}

// removeStaleTemps removes this driver's temporary spec files (writeValidated's names, of the
// per-claim specs and of the shares' spec) that a crash between create and rename left
// behind; nothing else in the directory is touched. At
// start-up no write is in progress: the instance lock makes this process the only writer.
func removeStaleTemps(dir, driverName string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list CDI spec directory: %w", err)
	}
	claimPrefix := "." + driverName + "-" + specClass + "_"
	sharesPrefix := "." + sharesSpecName(driverName) + "."
	var errs []error
	for _, e := range entries {
		name := e.Name()
		ours := strings.HasPrefix(name, claimPrefix) || strings.HasPrefix(name, sharesPrefix)
		if e.Type().IsRegular() && ours && strings.HasSuffix(name, ".tmp") {
			if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove stale temporary spec: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

func writeAndClose(f *os.File, data []byte) error {
	_, err := f.Write(data)
	if err == nil {
		err = f.Chmod(specFileMode) // CreateTemp makes 0600; the runtime may not run as root
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write temporary file: %w", err)
	}
	return nil
}

// Remove deletes the claim's spec. A missing spec is not an error (Unprepare is retried).
func (w *Writer) Remove(claimUID string) error {
	path := w.SpecPath(claimUID)
	if path == "" {
		return fmt.Errorf("%w: claim UID %q is not a canonical lower-case UUID", ErrInvalidClaim, claimUID)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// ListClaims returns the UIDs of the claims whose spec file this driver's Writer would write
// (<driver>-claim_<canonical UID>.json) and that exist in the spec directory: start-up removes
// those the checkpoint does not know, which a crash of Prepare before its checkpoint write
// leaves behind (contract §7). Other files, other drivers' specs included, are not listed. A
// missing directory lists nothing.
func (w *Writer) ListClaims() ([]string, error) {
	entries, err := os.ReadDir(w.opts.SpecDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list CDI spec directory: %w", err)
	}
	// specFileName with an empty UID is "<driver>-claim_.json": the part before and after it.
	prefix, suffix, _ := strings.Cut(specFileName(w.opts.DriverName, ""), "_")
	prefix += "_"
	var uids []string
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if uid, ok := strings.CutSuffix(rest, suffix); ok && w.SpecPath(uid) != "" {
			uids = append(uids, uid)
		}
	}
	return uids, nil
}

// Exists reports whether the claim's spec file is present (it does not check its content).
func (w *Writer) Exists(claimUID string) (bool, error) {
	path := w.SpecPath(claimUID)
	if path == "" {
		return false, fmt.Errorf("%w: claim UID %q is not a canonical lower-case UUID", ErrInvalidClaim, claimUID)
	}
	_, err := os.Lstat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("check CDI spec for claim %s: %w", claimUID, err)
	}
}
