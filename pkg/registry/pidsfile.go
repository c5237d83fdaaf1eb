package registry

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// errNoPIDs: the list to write is empty. pids.config is never written empty (contract §6).
var errNoPIDs = errors.New("no process to list")

// WritePIDsConfig writes <configDir>/pids.config in place as contract §6 says: open with
// O_NOFOLLOW (the directory too), flock(LOCK_EX), pwrite at 0, ftruncate to the new length;
// never truncated first and never renamed, so a reader holding LOCK_SH sees the old list
// or the new one, never an empty file. list runs while the lock is held, so two writers of
// one file cannot publish their lists out of order. Mode 0644; owned by root when the
// writer is root.
func WritePIDsConfig(configDir string, list func() ([]int, error)) error {
	dfd, err := unix.Open(configDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open config dir %s: %w", configDir, err)
	}
	defer unix.Close(dfd)
	// O_NONBLOCK: a FIFO planted in place of the file must not hang the server (fstat refuses it).
	fd, err := unix.Openat(dfd, contract.PIDsConfigName,
		unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, contract.PIDsConfigMode)
	if err != nil {
		return fmt.Errorf("open %s/%s: %w", configDir, contract.PIDsConfigName, err)
	}
	f := os.NewFile(uintptr(fd), configDir+"/"+contract.PIDsConfigName)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		return fmt.Errorf("%s is not a regular file with one link (mode %o, %d links): refusing to write it", f.Name(), st.Mode, st.Nlink)
	}
	if err := flockRetry(fd, unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	pids, err := list()
	if err != nil {
		return err
	}
	if len(pids) == 0 {
		return fmt.Errorf("write %s: %w", f.Name(), errNoPIDs)
	}
	content := formatPIDs(pids)
	for off := 0; off < len(content); {
		n, err := unix.Pwrite(fd, content[off:], int64(off))
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return fmt.Errorf("write %s: %w", f.Name(), err)
		}
		off += n
	}
	if err := unix.Ftruncate(fd, int64(len(content))); err != nil {
		return fmt.Errorf("truncate %s: %w", f.Name(), err)
	}
	if st.Mode&0o7777 != contract.PIDsConfigMode {
		if err := unix.Fchmod(fd, contract.PIDsConfigMode); err != nil {
			return fmt.Errorf("chmod %s: %w", f.Name(), err)
		}
	}
	if os.Geteuid() == 0 && (st.Uid != 0 || st.Gid != 0) {
		if err := unix.Fchown(fd, 0, 0); err != nil {
			return fmt.Errorf("chown %s: %w", f.Name(), err)
		}
	}
	return nil // close releases the lock
}

// formatPIDs is "<pid>\n" per PID, in the order given (callers sort).
func formatPIDs(pids []int) []byte {
	b := make([]byte, 0, len(pids)*8)
	for _, p := range pids {
		b = strconv.AppendInt(b, int64(p), 10)
		b = append(b, '\n')
	}
	return b
}

func flockRetry(fd, how int) error {
	for {
		if err := unix.Flock(fd, how); err != unix.EINTR {
			return err
		}
	}
}
