package registry

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// peer is the process at the other end of a connection, as the kernel recorded it at
// connect(2) (SO_PEERCRED). pidfd, where the kernel offers SO_PEERPIDFD (Linux ≥ 6.5), pins
// that very process: after its /proc entry was read, a live pidfd proves the PID was not
// reused by another process in between.
type peer struct {
	pid   int
	uid   uint32
	pidfd int // -1 when the kernel has no SO_PEERPIDFD
}

// peerOf reads the credentials of c's peer. A peer whose PID is not visible in this PID
// namespace (0) is an error.
func peerOf(c *net.UnixConn) (peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return peer{}, err
	}
	p := peer{pidfd: -1}
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		var cred *unix.Ucred
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if credErr != nil {
			return
		}
		p.pid, p.uid = int(cred.Pid), cred.Uid
		if pfd, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
			p.pidfd = pfd
		}
	}); err != nil {
		return peer{}, err
	}
	if credErr != nil {
		return peer{}, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	if p.pid <= 0 {
		p.close()
		return peer{}, errors.New("the caller's PID is not visible in this PID namespace")
	}
	return p, nil
}

// peerPID reads only the PID of c's peer (SO_PEERCRED): what a lookup of a known caller needs.
func peerPID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var pid int
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		var cred *unix.Ucred
		if cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); credErr == nil {
			pid = int(cred.Pid)
		}
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	if pid <= 0 {
		return 0, errors.New("the caller's PID is not visible in this PID namespace")
	}
	return pid, nil
}

// stillSame reports whether the peer process is still alive, so that what was read from
// /proc/<pid> since peerOf was about it. Without a pidfd it cannot tell and says true: the
// PID from SO_PEERCRED is then trusted as the kernel gave it.
func (p peer) stillSame() bool {
	if p.pidfd < 0 {
		return true
	}
	return unix.PidfdSendSignal(p.pidfd, 0, nil, 0) == nil
}

func (p peer) close() {
	if p.pidfd >= 0 {
		_ = unix.Close(p.pidfd)
	}
}
