// Package fsutil holds small file-system primitives that several packages share: today the
// crash-safe replacement of a file (the checkpoint, the installed library; CDI specs use their own
// variant that has the CDI library validate the temporary file before the rename).
package fsutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// WriteFileAtomic replaces path with data so that a reader, or the next boot after a crash,
// sees either the old content or the new one in full, never a mix or an empty file.
//
// It writes a temporary file in path's directory (a rename is only atomic within one file
// system), sets perm explicitly (the umask does not apply), writes and fsyncs it, renames it
// over path and fsyncs the directory so that the rename itself is durable. The directory must
// exist. On any failure before the rename the temporary file is removed and path is untouched.
// A failure of the final directory fsync is reported although the rename has happened: the new
// content is visible but not known to be durable. Errors name the temporary file, which lies
// next to path; callers add path itself.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, tempPrefix(base)+"*")
	if err != nil {
		return fmt.Errorf("create temporary file: %w", err)
	}
	tmpName := tmp.Name()
	if err := writeAndSync(tmp, data, perm); err != nil {
		return errors.Join(fmt.Errorf("write temporary file: %w", err), removeTemp(tmpName))
	}
	if err := os.Rename(tmpName, path); err != nil {
		return errors.Join(fmt.Errorf("rename temporary file: %w", err), removeTemp(tmpName))
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("make rename durable: %w", err)
	}
	return nil
}

// tempPrefix starts the names of WriteFileAtomic's temporary files for base: hidden, and
// distinct per target so that RemoveTempFiles touches nothing else.
func tempPrefix(base string) string { return "." + base + ".tmp-" }

// RemoveTempFiles removes the temporary files that WriteFileAtomic calls for path left behind
// when the process died between creating and renaming them. Call it only while no
// WriteFileAtomic for path is in flight (at start-up, under the instance lock).
func RemoveTempFiles(path string) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list temporary files of %s: %w", path, err)
	}
	var errs []error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix(base)) && e.Type().IsRegular() {
			errs = append(errs, removeTemp(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// writeAndSync sets the mode of f, writes data, fsyncs and closes f; f is closed on every path.
func writeAndSync(f *os.File, data []byte, perm os.FileMode) error {
	err := f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	return err
}

// removeTemp removes a temporary file left by a failed write; a file already gone is fine.
func removeTemp(name string) error {
	if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove temporary file %s: %w", name, err)
	}
	return nil
}

// SyncDir fsyncs a directory, making the creation, removal or renaming of its entries durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s for fsync: %w", dir, err)
	}
	err = d.Sync()
	if closeErr := d.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
