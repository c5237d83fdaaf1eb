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

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
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
	return &Writer{opts: o, gpuVendor: vendor, gpuClass: class}, nil
}

// Write builds the claim's spec, has the CDI library's loader accept it, and puts it in place
// atomically (temporary file, fsync, rename; mode 0644). It is idempotent, as it must be: the
// kubelet retries Prepare and the plugin re-creates specs at start-up. When the file already
// holds the identical bytes, nothing is written. Cost is O(1) in the number of specs in the
// directory.
func (w *Writer) Write(c Claim) error {
	if err := w.validate(&c); err != nil {
		return err
	}
	data, err := json.MarshalIndent(w.buildSpec(&c), "", "  ")
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

// writeValidated writes data to a temporary file next to path, has the CDI library load it, and
// renames it over path. The temporary name ends in ".tmp", which CDI caches (the runtime's
// included) do not scan, so they never see a partial or unchecked spec.
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
	if err := writeAndSync(f, data); err != nil {
		return err
	}
	// The same loader the runtime uses: parse (unknown fields refused), version, kind, device
	// names, edits. What it refuses here, the runtime would refuse at container creation.
	if _, err := cdiapi.ReadSpec(tmp, 0); err != nil {
		return fmt.Errorf("CDI library refuses the spec: %w", err)
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

func writeAndSync(f *os.File, data []byte) error {
	_, err := f.Write(data)
	if err == nil {
		err = f.Chmod(specFileMode) // CreateTemp makes 0600; the runtime may not run as root
	}
	if err == nil {
		err = f.Sync()
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
