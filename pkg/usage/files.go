package usage

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// readSmallFile reads the regular file name in dir, at most limit bytes, without following a
// symlink or blocking on a FIFO. The config directory is the plugin's own and read-only in the
// container, but the checks cost nothing and keep the reader safe wherever it is pointed.
// A missing file wraps fs.ErrNotExist.
func readSmallFile(dir, name string, limit int) ([]byte, error) {
	path := filepath.Join(dir, name)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("open %s: %w", path, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("inspect %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s is not a regular file (mode %o)", path, st.Mode)
	}
	if st.Size > int64(limit) {
		return nil, fmt.Errorf("%s has %d bytes, more than %d", path, st.Size, limit)
	}
	buf := make([]byte, st.Size)
	if err := preadFull(fd, buf, 0); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return buf, nil
}

// readConfig reads the vgpu.config the plugin wrote into a config directory (contract §4a):
// the GPUs in the order the library indexes its ledger by, with their limits.
func readConfig(configDir string) (contract.ContainerConfig, error) {
	data, err := readSmallFile(configDir, contract.ContainerConfigName, contract.ContainerConfigMaxBytes)
	if err != nil {
		return contract.ContainerConfig{}, err
	}
	c, err := contract.ParseContainerConfig(data)
	if err != nil {
		return contract.ContainerConfig{}, fmt.Errorf("parse %s: %w", filepath.Join(configDir, contract.ContainerConfigName), err)
	}
	return c, nil
}

// readPIDs reads the host PIDs the registry wrote into a config directory (contract §6). A
// missing file is no PID: nothing in the container has registered yet.
func readPIDs(configDir string) ([]int, error) {
	data, err := readSmallFile(configDir, contract.PIDsConfigName, contract.MaxPIDsConfigBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	pids, err := contract.ParsePIDs(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(configDir, contract.PIDsConfigName), err)
	}
	return pids, nil
}
