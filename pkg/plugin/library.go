package plugin

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/fsutil"
)

// DefaultLibrarySource is where the plugin image carries libvgpu.so (hack/images.sh, Dockerfile).
const DefaultLibrarySource = "/usr/local/lib/vgpu-dra/libvgpu.so"

// installLibrary copies libvgpu.so from src into <state>/lib and writes the ld.so.preload file
// that CDI mounts over the container's /etc/ld.so.preload. Both are replaced atomically (temp
// file + rename): running containers keep the inode their bind mount pinned, and a process that
// maps the library never sees a half-written file. It reports whether the library is installed;
// an empty or missing src leaves whatever an earlier install put there.
func installLibrary(logger klog.Logger, src string, dirs claimdir.Layout) (bool, error) {
	if src != "" {
		data, err := os.ReadFile(src)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			logger.Info("No libvgpu.so to install", "source", src)
		case err != nil:
			return false, fmt.Errorf("read libvgpu.so from %s: %w", src, err)
		default:
			if err := os.MkdirAll(dirs.LibDir(), 0o755); err != nil {
				return false, fmt.Errorf("create %s: %w", dirs.LibDir(), err)
			}
			if err := writeIfChanged(dirs.LibraryPath(), data); err != nil {
				return false, fmt.Errorf("install libvgpu.so: %w", err)
			}
			// The preload file names the library's path inside the container (contract §3).
			if err := writeIfChanged(dirs.PreloadPath(), []byte(contract.ContainerLibraryPath+"\n")); err != nil {
				return false, fmt.Errorf("install ld.so.preload: %w", err)
			}
			logger.Info("Installed libvgpu.so", "source", src, "path", dirs.LibraryPath(), "bytes", len(data))
		}
	}
	return fileExists(dirs.LibraryPath()) && fileExists(dirs.PreloadPath()), nil
}

func writeIfChanged(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return fsutil.WriteFileAtomic(path, data, 0o644)
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
