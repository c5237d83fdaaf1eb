// Package instancelock makes sure only one plugin instance runs per node (contract §1, the
// "Upgrades" section of architecture.md): two live instances would both write the checkpoint,
// both serve the registry and, as two NRI plugins of one name, inject the same mounts twice.
package instancelock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// pollInterval is how often a waiting instance retries the lock.
const pollInterval = 250 * time.Millisecond

// Lock is a held instance lock; the lock lives as long as the file descriptor.
type Lock struct {
	file *os.File
}

// Acquire takes an exclusive flock on path, creating it (and its directory) when missing.
// While another process holds it, Acquire logs once who holds it and why this one waits, then
// waits until the lock is free or ctx ends. The holder's PID is written into the file.
func Acquire(ctx context.Context, path string) (*Lock, error) {
	logger := klog.FromContext(ctx)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create directory of instance lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open instance lock %s: %w", path, err)
	}
	logged := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !logged {
			logger.Info("Another plugin instance holds the instance lock; waiting for it to exit (one instance per node: two would both write the checkpoint, serve the registry and inject NRI mounts)",
				"lock", path, "holderPID", holderPID(path))
			logged = true
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("waiting for instance lock %s: %w", path, context.Cause(ctx))
		case <-time.After(pollInterval):
		}
	}
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if _, err := f.WriteAt(pid, 0); err == nil {
		_ = f.Truncate(int64(len(pid)))
	}
	if logged {
		logger.Info("Took over the instance lock", "lock", path)
	}
	return &Lock{file: f}, nil
}

// Release drops the lock.
func (l *Lock) Release() error {
	if l == nil || l.file == nil {
		return nil
	}
	err := l.file.Close()
	l.file = nil
	return err
}

func holderPID(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	if s := strings.TrimSpace(string(b)); s != "" {
		return s
	}
	return "unknown"
}
