//go:build chaos

package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dirWatch reports the names that appear in one directory (created, or renamed into it: how the
// plugin and containerd write their files), through inotify: a fault that must strike at a
// precise point of a Prepare cannot wait for a poll.
type dirWatch struct {
	fd  int
	dir string
}

func watchDir(dir string) (*dirWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("watch %s: %w", dir, err)
	}
	return &dirWatch{fd: fd, dir: dir}, nil
}

func (w *dirWatch) close() { _ = unix.Close(w.fd) }

// next returns the names that appeared, waiting at most d for the first; none when d passed.
func (w *dirWatch) next(d time.Duration) ([]string, error) {
	fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, int(d.Milliseconds()))
	if errors.Is(err, unix.EINTR) || n == 0 {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("wait for %s: %w", w.dir, err)
	}
	buf := make([]byte, 64<<10)
	m, err := unix.Read(w.fd, buf)
	if errors.Is(err, unix.EAGAIN) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read events of %s: %w", w.dir, err)
	}
	var names []string
	for off := 0; off+unix.SizeofInotifyEvent <= m; {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		start := off + unix.SizeofInotifyEvent
		name := buf[start : start+int(ev.Len)]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		names = append(names, string(name))
		off = start + int(ev.Len)
	}
	return names, nil
}

// until waits until match accepts a name that appears, or timeout passes (false).
func (w *dirWatch) until(timeout time.Duration, match func(name string) bool) (bool, error) {
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		names, err := w.next(left)
		if err != nil {
			return false, err
		}
		for _, n := range names {
			if match(n) {
				return true, nil
			}
		}
	}
}

// processStart is the start time of a process (field 22 of /proc/PID/stat, in clock ticks since
// boot): with the PID, it names one process, so a reused PID is never signalled.
func processStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("read the start time of process %d: %w", pid, err)
	}
	// The command (field 2) is in parentheses and may hold spaces: count from the last ')'.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 20 {
		return 0, fmt.Errorf("process %d: short stat %q", pid, b)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}
