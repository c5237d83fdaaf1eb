package claimdir

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"

	"golang.org/x/sys/unix"
)

// claimFSInodes bounds the inodes of one claim's tmpfs: a container directory set takes about
// ten (four directories, the ledger, the core file, pids.config, vgpu.config), so this leaves
// room for hundreds of containers sharing a claim while a container creating empty files
// cannot exhaust the kernel's memory either.
const claimFSInodes = 4096

// ensureTmpfs makes the directory open as fd (the claim directory d, a child of parent) the
// root of a tmpfs of d.fsBytes, mounting one when it is not yet, and returns a descriptor of
// that root (fd itself when it already was one; otherwise fd is closed).
//
// The mount target is given as /proc/self/fd/<fd>, so the kernel mounts on exactly the
// directory this call opened and checked, whatever happens to the path meanwhile. Whether the
// directory already is a mount is told by its device: a tmpfs root is on a device of its own,
// the state directory's file system is the parent's. Only the plugin mounts there: the claims
// root is 0700 and root's.
func (t *claimsTree) ensureTmpfs(parent, fd int, d dirSpec) (int, error) {
	var pst, st unix.Stat_t
	if err := unix.Fstat(parent, &pst); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("inspect the parent of %s: %w", t.abs(d.rel), err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("inspect %s: %w", t.abs(d.rel), err)
	}
	if st.Dev != pst.Dev {
		return fd, nil // already mounted (start-up recovery, a repeated Prepare, NRI)
	}
	opts := "size=" + strconv.FormatInt(d.fsBytes, 10) + ",nr_inodes=" + strconv.Itoa(claimFSInodes) +
		",mode=" + strconv.FormatUint(uint64(d.mode.Perm()), 8) + ",uid=" + strconv.Itoa(unix.Geteuid()) + ",gid=" + strconv.Itoa(unix.Getegid())
	err := unix.Mount("tmpfs", "/proc/self/fd/"+strconv.Itoa(fd), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts)
	_ = unix.Close(fd)
	if err != nil {
		return -1, &ClaimFSError{Path: t.abs(d.rel), Err: fmt.Errorf("mount: %w", err)}
	}
	// The descriptor still names the directory under the mount: open the tmpfs root.
	return t.openDirAt(parent, d.rel)
}

// checkTmpfs fails unless the directory open as fd (d, a child of parent) is a mount: the
// claim's tmpfs that Prepare mounted.
func (t *claimsTree) checkTmpfs(parent, fd int, d dirSpec) error {
	var pst, st unix.Stat_t
	if err := unix.Fstat(parent, &pst); err != nil {
		return fmt.Errorf("inspect the parent of %s: %w", t.abs(d.rel), err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("inspect %s: %w", t.abs(d.rel), err)
	}
	if st.Dev == pst.Dev {
		return &ClaimFSError{Path: t.abs(d.rel), Err: errors.New("the claim's tmpfs is not mounted (it is mounted when the claim is prepared)")}
	}
	return nil
}

// ClaimFSError says that a claim's tmpfs could not be mounted. The plugin needs CAP_SYS_ADMIN
// for it, and — in a pod — the state directory mounted with Bidirectional propagation, so that
// the runtime's bind mounts see the tmpfs rather than the empty directory under it.
type ClaimFSError struct {
	Path string
	Err  error
}

func (e *ClaimFSError) Error() string {
	return fmt.Sprintf("the claim's size-bounded tmpfs on %s: %v (the plugin needs CAP_SYS_ADMIN to mount it; --claim-fs-size=0 keeps claim directories on the state directory's file system, without a bound)", e.Path, e.Err)
}

func (e *ClaimFSError) Unwrap() error { return e.Err }

// removeClaimFS unmounts the claim directory's tmpfs, if it has one. MNT_DETACH: a container
// that still holds a bind mount of it (the kubelet unprepares after the pod's containers are
// gone, but a runtime may lag) keeps its view, and the memory is freed with its last user.
// A missing claim directory or claims root is not an error.
func (l Layout) removeClaimFS(rel string) error {
	t, err := l.openClaims(false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer t.close()
	var rootSt, st unix.Stat_t
	if err := unix.Stat(t.path, &rootSt); err != nil {
		return fmt.Errorf("inspect %s: %w", t.path, err)
	}
	if err := unix.Lstat(t.abs(rel), &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("inspect %s: %w", t.abs(rel), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Dev == rootSt.Dev {
		return nil // not a mount: removeAll deals with it
	}
	if err := unix.Unmount(t.abs(rel), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
		return fmt.Errorf("unmount the tmpfs of %s: %w", t.abs(rel), err)
	}
	return nil
}
