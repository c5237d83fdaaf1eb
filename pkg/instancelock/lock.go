// Package instancelock makes sure only one plugin instance owns a node's shared state at a time
// (contract §1, §14; the "Upgrades" section of architecture.md): two owners would both write the
// checkpoint, both serve the registry and, as two NRI plugins of one name, inject the same mounts
// twice. Whoever holds the flock owns; the kernel releases it when the holder dies, which is how a
// waiting instance learns that the owner crashed.
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

// ErrHeld is TryAcquire's answer while another open file description holds the lock.
var ErrHeld = errors.New("instance lock is held by another instance")

// Lock is a held instance lock; the lock lives as long as the file descriptor.
type Lock struct {
	file *os.File
}

// Acquire takes an exclusive flock on path, creating it (and its directory) when missing.
// While another process holds it, Acquire logs once who holds it and why this one waits, then
// waits until the lock is free or ctx ends. The holder's PID is written into the file.
func Acquire(ctx context.Context, path string) (*Lock, error) {
	logger := klog.FromContext(ctx)
	logged := false
	for {
		l, err := TryAcquire(path)
		if err == nil {
			if logged {
				logger.Info("Took over the instance lock", "lock", path)
			}
			return l, nil
		}
		if !errors.Is(err, ErrHeld) {
			return nil, err
		}
		if !logged {
			logger.Info("Another plugin instance holds the instance lock; waiting for it to exit (one instance per node: two would both write the checkpoint, serve the registry and inject NRI mounts)",
				"lock", path, "holderPID", ReadHolder(path).PID)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for instance lock %s: %w", path, context.Cause(ctx))
		case <-time.After(pollInterval):
		}
	}
}

// TryAcquire takes the lock if it is free and returns ErrHeld at once if it is not. On success
// the holder's PID is written into the file (its first line).
func TryAcquire(path string) (*Lock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create directory of instance lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open instance lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrHeld
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	l := &Lock{file: f}
	l.write("")
	return l, nil
}

// SetRecord writes the holder's PID and, on the second line, record (one line, no newline):
// what the holder tells instances that find the lock held (the handover protocol's record,
// contract §14). An empty record leaves the PID alone.
func (l *Lock) SetRecord(record string) {
	if l == nil || l.file == nil {
		return
	}
	l.write(strings.ReplaceAll(record, "\n", " "))
}

func (l *Lock) write(record string) {
	content := strconv.Itoa(os.Getpid()) + "\n"
	if record != "" {
		content += record + "\n"
	}
	// One write from offset 0, then the truncation: a reader sees the new first line at once.
	if _, err := l.file.WriteAt([]byte(content), 0); err == nil {
		_ = l.file.Truncate(int64(len(content)))
	}
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

// Holder is what the lock file says about its last holder.
type Holder struct {
	// PID is the holder's PID as written ("unknown" when the file is missing or empty).
	PID string
	// Record is the holder's second line, "" when it wrote none (a holder that does not speak
	// the handover protocol: an older plugin, the device plugin).
	Record string
}

// ReadHolder reads the lock file. It says who held the lock last, not whether anybody holds it
// now: TryAcquire tells that.
func ReadHolder(path string) Holder {
	b, err := os.ReadFile(path)
	if err != nil {
		return Holder{PID: "unknown"}
	}
	pid, record, _ := strings.Cut(string(b), "\n")
	h := Holder{PID: strings.TrimSpace(pid), Record: strings.TrimSpace(record)}
	if h.PID == "" {
		h.PID = "unknown"
	}
	return h
}
