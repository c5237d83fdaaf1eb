package claimdir

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// WriteConfig puts data in place as the set's vgpu.config (contract §4a), replacing it
// atomically: a temporary file in the same directory, then rename, so the library never reads
// a half-written file. Identical content is not rewritten. The config directory is root's and
// read-only in the container, so no container can have planted anything in it.
//
// There is no fsync: the file sits on the claim's tmpfs (or, without one, is written again at
// every CreateContainer and Prepare), and nothing on the NRI hook path may wait on the disk.
func (l Layout) WriteConfig(d Dirs, data []byte) error {
	path := filepath.Join(d.Config, contract.ContainerConfigName)
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(d.Config, "."+contract.ContainerConfigName+"-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if tmp != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(contract.ContainerConfigMode); err != nil {
		return fmt.Errorf("set mode of %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("put %s in place: %w", path, err)
	}
	tmp = nil
	return nil
}
