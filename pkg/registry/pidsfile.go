package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// errNoPIDs: the list to write is empty. pids.config is never written empty (contract §6).
var errNoPIDs = errors.New("no process to list")

// ErrLocked is returned when pids.config stayed locked (by a reader: the container's own
// processes take LOCK_SH on it) until the write's context ended.
var ErrLocked = errors.New("pids.config stayed locked")

// WritePIDsConfig writes <configDir>/pids.config in place as contract §6 says: open with
// O_NOFOLLOW (the directory too), flock(LOCK_EX), pwrite at 0, ftruncate to the new length;
// never truncated first and never renamed, so a reader holding LOCK_SH sees the old list
// or the new one, never an empty file. list runs while the lock is held, so two writers of
// one file cannot publish their lists out of order. Mode 0644; owned by root when the
// writer is root. The lock is waited for until ctx ends: past its deadline the error wraps
// ErrLocked, once it is cancelled context.Canceled.
func WritePIDsConfig(ctx context.Context, configDir string, list func() ([]int, error)) error {
	return writePIDsConfig(ctx, configDir, nil, list)
}

// writePIDsConfig is WritePIDsConfig that calls onWait, when not nil, before it waits for the
// lock.
func writePIDsConfig(ctx context.Context, configDir string, onWait func(), list func() ([]int, error)) error {
	dfd, err := unix.Open(configDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open config dir %s: %w", configDir, err)
	}
	defer unix.Close(dfd)
	name := configDir + "/" + contract.PIDsConfigName
	for range 3 {
		fd, created, err := openPIDsFile(dfd)
		if err != nil {
			return fmt.Errorf("open %s: %w", name, err)
		}
		retry, err := writeLocked(ctx, fd, dfd, created, name, onWait, list)
		_ = unix.Close(fd) // releases the lock
		if !retry {
			return err
		}
	}
	return fmt.Errorf("write %s: the file kept disappearing", name)
}

// openPIDsFile opens pids.config for writing, creating it if missing (created says so).
// O_NONBLOCK: a FIFO planted in place of the file must not hang the server (the caller's
// fstat refuses it).
func openPIDsFile(dfd int) (fd int, created bool, err error) {
	const flags = unix.O_WRONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK
	for {
		fd, err = unix.Openat(dfd, contract.PIDsConfigName, flags|unix.O_CREAT|unix.O_EXCL, contract.PIDsConfigMode)
		if err == nil {
			return fd, true, nil
		}
		if err != unix.EEXIST {
			return -1, false, err
		}
		fd, err = unix.Openat(dfd, contract.PIDsConfigName, flags, 0)
		if err != unix.ENOENT {
			return fd, false, err
		}
	}
}

// writeLocked does the locked part of WritePIDsConfig on fd. retry is true when the file
// was unlinked by another writer while this one waited for the lock.
func writeLocked(ctx context.Context, fd, dfd int, created bool, name string, onWait func(), list func() ([]int, error)) (retry bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink > 1 {
		return false, fmt.Errorf("%s is not a regular file with one link (mode %o, %d links): refusing to write it", name, st.Mode, st.Nlink)
	}
	if err := lockExclusive(ctx, fd, fileID{uint64(st.Dev), uint64(st.Ino)}, onWait); err != nil {
		if created {
			_ = unix.Unlinkat(dfd, contract.PIDsConfigName, 0) // never leave it empty
		}
		return false, fmt.Errorf("lock %s: %w", name, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", name, err)
	}
	if st.Nlink == 0 {
		return true, nil
	}
	pids, err := list()
	if err == nil && len(pids) == 0 {
		err = fmt.Errorf("write %s: %w", name, errNoPIDs)
	}
	if err != nil {
		if created {
			// Never leave an empty pids.config behind. A writer that opened it meanwhile
			// sees it unlinked once it holds the lock, and opens it again.
			_ = unix.Unlinkat(dfd, contract.PIDsConfigName, 0)
		}
		return false, err
	}
	content := formatPIDs(pids)
	for off := 0; off < len(content); {
		n, err := unix.Pwrite(fd, content[off:], int64(off))
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return false, fmt.Errorf("write %s: %w", name, err)
		}
		off += n
	}
	if err := unix.Ftruncate(fd, int64(len(content))); err != nil {
		return false, fmt.Errorf("truncate %s: %w", name, err)
	}
	if st.Mode&0o7777 != contract.PIDsConfigMode {
		if err := unix.Fchmod(fd, contract.PIDsConfigMode); err != nil {
			return false, fmt.Errorf("chmod %s: %w", name, err)
		}
	}
	if os.Geteuid() == 0 && (st.Uid != 0 || st.Gid != 0) {
		if err := unix.Fchown(fd, 0, 0); err != nil {
			return false, fmt.Errorf("chown %s: %w", name, err)
		}
	}
	return false, nil
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

// errPanicked is what callers queued behind a write that panicked receive.
var errPanicked = errors.New("the pids.config write panicked")
