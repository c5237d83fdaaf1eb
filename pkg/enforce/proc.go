package enforce

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// CgroupReader is where a process's cgroup comes from (registry.CgroupHierarchy: the one
// hierarchy the registry checks callers in, so that the enforcer and the registry agree on
// what a container is).
type CgroupReader interface {
	OfPID(pid int) (string, error)
}

// Killer kills processes by PID, but only a process that is still in the cgroup it was seen
// in: the process is pinned with a pidfd first, its cgroup read through /proc after that, and
// the signal sent through the pidfd, so a PID reused by another process in between is never
// signalled (the NRI plugin's stray guard does the same for a container's init process).
type Killer struct {
	Cgroups CgroupReader
}

// Kill SIGKILLs pid if it is in cgroup. A process that has already exited answers an error
// wrapping ErrGone.
func (k Killer) Kill(pid int, cgroup string) error {
	if pid <= 0 || cgroup == "" || cgroup == "/" {
		return fmt.Errorf("refusing to kill pid %d of cgroup %q: no container's process", pid, cgroup)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	if err != nil {
		return fmt.Errorf("open process %d: %w", pid, err)
	}
	defer unix.Close(fd)
	now, err := k.Cgroups.OfPID(pid)
	if err != nil {
		// The pidfd is open, so the PID is this process's until it is reaped: a missing
		// /proc entry means it exited in between.
		return fmt.Errorf("pid %d: %w (%v)", pid, ErrGone, err)
	}
	if now != cgroup {
		return fmt.Errorf("process %d is in cgroup %q now, not %q: not the process that was seen", pid, now, cgroup)
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("pid %d: %w", pid, ErrGone)
		}
		return fmt.Errorf("SIGKILL process %d: %w", pid, err)
	}
	return nil
}
