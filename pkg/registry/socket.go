package registry

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// maxSocketPath leaves room under the kernel's 108-byte sun_path (with the NUL).
const maxSocketPath = 107

var stageSeq atomic.Uint64

// listenStaged binds a unix socket at path without the path ever being missing to a
// client: it binds a staged name in the same directory, sets mode 0666, and renames it over
// path (rename replaces a predecessor's socket atomically). The directory is created 0711.
// It returns the listener and the socket's inode, the server's proof of ownership later.
func listenStaged(path string) (*net.UnixListener, uint64, error) {
	dir := filepath.Dir(path)
	staged := filepath.Join(dir, fmt.Sprintf(".%s.%d.%d", filepath.Base(path), os.Getpid(), stageSeq.Add(1)))
	if len(staged) > maxSocketPath || len(path) > maxSocketPath {
		return nil, 0, fmt.Errorf("registry socket path %s is too long for a unix socket", staged)
	}
	if err := ensureRegistryDir(dir); err != nil {
		return nil, 0, err
	}
	if err := os.Remove(staged); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("remove stale %s: %w", staged, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: staged, Net: "unix"})
	if err != nil {
		return nil, 0, fmt.Errorf("listen on %s: %w", staged, err)
	}
	// The listener's own unlink-on-close would act on the staged name; ownership of the real
	// path is decided by inode (see Server.Stop).
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, uint64, error) {
		_ = ln.Close()
		_ = os.Remove(staged)
		return nil, 0, err
	}
	if err := os.Chmod(staged, contract.RegistrySocketMode); err != nil {
		return fail(fmt.Errorf("chmod %s: %w", staged, err))
	}
	ino, err := inodeOf(staged)
	if err != nil {
		return fail(err)
	}
	if err := os.Rename(staged, path); err != nil {
		return fail(fmt.Errorf("move registry socket into place at %s: %w", path, err))
	}
	return ln, ino, nil
}

// ensureRegistryDir creates dir 0711 (traversable, not listable: it is mounted into every
// vGPU container) and fixes the mode of an existing one.
func ensureRegistryDir(dir string) error {
	if err := os.MkdirAll(dir, contract.RegistryDirMode); err != nil {
		return fmt.Errorf("create registry dir %s: %w", dir, err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("stat registry dir %s: %w", dir, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("registry dir %s is not a directory", dir)
	}
	if st.Mode().Perm() != contract.RegistryDirMode {
		if err := os.Chmod(dir, contract.RegistryDirMode); err != nil {
			return fmt.Errorf("chmod registry dir %s: %w", dir, err)
		}
	}
	return nil
}

// inodeOf is the inode of the file at path, not following a symlink.
func inodeOf(path string) (uint64, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return 0, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("no inode for %s", path)
	}
	return sys.Ino, nil
}
