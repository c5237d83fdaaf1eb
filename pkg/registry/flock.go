package registry

import (
	"context"
	"errors"
	"sync"

	"golang.org/x/sys/unix"
)

// fileID names a file by device and inode.
type fileID struct{ dev, ino uint64 }

// blockedLocks are the flock(2) calls that lockExclusive gave up waiting for and that are
// still blocked in the kernel: at most one per file.
var blockedLocks = struct {
	mu sync.Mutex
	m  map[fileID]chan struct{} // closed when that flock(2) has returned
}{m: map[fileID]chan struct{}{}}

// lockExclusive takes flock(LOCK_EX) on fd (the file id) before ctx ends; past its deadline
// the error is ErrLocked, once it is cancelled context.Canceled. onWait, when not nil, is
// called when the lock is not free at once, before each wait.
//
// The wait is a blocking flock(2) in a goroutine, on a dup of fd (the same open file
// description, so the lock it takes is fd's), that the caller abandons when ctx ends: the
// caller then closes fd, and the goroutine, once the holder lets go, gets the lock, closes
// the dup — the last reference, which releases the lock — and ends. It is abandoned safely
// because it touches only its own descriptor, and it is bounded: while one abandoned call
// is still blocked on a file, later writers of that file wait for it to return instead of
// starting another, so a tenant that holds its pids.config for hours costs one goroutine and
// one descriptor, not one per registration. A blocking call rather than polling with
// LOCK_NB: the kernel wakes it the moment the last reader lets go, where polling can keep
// missing short gaps between readers that hold LOCK_SH most of the time.
func lockExclusive(ctx context.Context, fd int, id fileID, onWait func()) error {
	for {
		switch err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); {
		case err == nil:
			return nil
		case err == unix.EINTR:
			continue
		case err != unix.EWOULDBLOCK:
			return err
		}
		if onWait != nil {
			onWait()
		}
		blockedLocks.mu.Lock()
		prev, blocked := blockedLocks.m[id]
		blockedLocks.mu.Unlock()
		if !blocked {
			return blockingLock(ctx, fd, id)
		}
		select {
		case <-prev: // the abandoned call returned: the lock was let go at least once
		case <-ctx.Done():
			return lockWaitEnded(ctx)
		}
	}
}

// blockingLock waits in flock(2) on a dup of fd until it returns or ctx ends.
func blockingLock(ctx context.Context, fd int, id fileID) error {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	returned := make(chan struct{})
	result := make(chan error, 1)
	go func() {
		var err error
		for {
			if err = unix.Flock(dup, unix.LOCK_EX); err != unix.EINTR {
				break
			}
		}
		_ = unix.Close(dup)
		result <- err
		blockedLocks.mu.Lock()
		if blockedLocks.m[id] == returned {
			delete(blockedLocks.m, id)
		}
		blockedLocks.mu.Unlock()
		close(returned)
	}()
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
	}
	// Abandon the call, unless it returned meanwhile. Recorded only now: a call that returns
	// at once never makes other writers wait for it.
	blockedLocks.mu.Lock()
	select {
	case <-returned:
	default:
		if _, taken := blockedLocks.m[id]; !taken {
			blockedLocks.m[id] = returned
		}
	}
	blockedLocks.mu.Unlock()
	select {
	case err := <-result:
		return err // it got the lock after all
	default:
		return lockWaitEnded(ctx)
	}
}

func lockWaitEnded(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ErrLocked
	}
	return ctx.Err()
}
