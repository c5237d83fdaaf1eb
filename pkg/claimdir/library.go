package claimdir

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/fsutil"
)

// LibraryInstall says what InstallLibrary did.
type LibraryInstall struct {
	// Installed: the library and the preload file are both in place, from this install or an
	// earlier one. Without them containers get their limits but nothing enforces them.
	Installed bool
	// SourceMissing: the source named does not exist; what an earlier install left is kept.
	SourceMissing bool
	// Bytes is the size of the library read from the source; 0 when none was read.
	Bytes int
}

// InstallLibrary copies libvgpu.so from src into <state>/lib and writes the ld.so.preload file
// that CDI mounts over the container's /etc/ld.so.preload (contract §3). Both are replaced
// atomically (temporary file + rename) and only when their content changed: running containers
// keep the inode their bind mount pinned, and a process that maps the library never sees a
// half-written file. An empty or missing src leaves whatever an earlier install put there.
// Shared by both plugins (kubelet plugin and device plugin).
func (l Layout) InstallLibrary(src string) (LibraryInstall, error) {
	var out LibraryInstall
	if src != "" {
		data, err := os.ReadFile(src)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			out.SourceMissing = true
		case err != nil:
			return out, fmt.Errorf("read libvgpu.so from %s: %w", src, err)
		default:
			if err := os.MkdirAll(l.LibDir(), 0o755); err != nil {
				return out, fmt.Errorf("create %s: %w", l.LibDir(), err)
			}
			if err := writeIfChanged(l.LibraryPath(), data); err != nil {
				return out, fmt.Errorf("install libvgpu.so: %w", err)
			}
			// The preload file names the library's path inside the container (contract §3).
			if err := writeIfChanged(l.PreloadPath(), []byte(contract.ContainerLibraryPath+"\n")); err != nil {
				return out, fmt.Errorf("install ld.so.preload: %w", err)
			}
			out.Bytes = len(data)
		}
	}
	out.Installed = l.LibraryInstalled()
	return out, nil
}

// LibraryInstalled reports whether libvgpu.so and its preload file are in place (InstallLibrary).
func (l Layout) LibraryInstalled() bool {
	return isRegularFile(l.LibraryPath()) && isRegularFile(l.PreloadPath())
}

func writeIfChanged(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return fsutil.WriteFileAtomic(path, data, 0o644)
}

func isRegularFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
