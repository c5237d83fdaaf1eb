package registry

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// registered is the record of the processes this server answered OK, for the node's enforcer
// (pkg/enforce, contract §15): a process of a vGPU container that holds GPU memory without
// having registered got there around libvgpu.so. Registration is what the server saw over its
// socket (SO_PEERCRED's PID), never what the container says.
//
// On the registration path it costs one clock read and a map write: a PID is recorded with the
// time of its OK answer, on CLOCK_BOOTTIME in the kernel's clock ticks, and a later check
// compares that with the process's start time (/proc/<pid>/stat) — a PID reused by a process
// that started after the answer is not the process that registered.
//
// A process that started before this server (it registered with an earlier plugin instance:
// a restart, a handover) is taken as registered when the container's pids.config lists it:
// that file is written by the registry alone (the container sees it read-only), at every
// registration, with the container's processes of that moment.
type registered struct {
	mu    sync.Mutex
	pids  map[int]uint64 // PID → boot-time ticks of its latest OK answer
	proc  string
	since uint64 // boot-time ticks when this server started
	// now is the clock in ticks since boot; tests replace it.
	now func() uint64
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's start time: 100 on every Linux ABI.
const clockTicks = 100

// bootTicks is the time since boot in clock ticks, rounded up (up: a registration's time is
// never earlier than the start time of the process that made it) or down.
func bootTicks(up bool) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	frac := uint64(ts.Nsec) * clockTicks
	if up {
		frac += 999_999_999
	}
	return uint64(ts.Sec)*clockTicks + frac/1_000_000_000
}

func newRegistered(proc string) *registered {
	// since is rounded down: a process that started in the server's first tick is not older
	// than the server.
	return &registered{pids: map[int]uint64{}, proc: proc, since: bootTicks(false), now: func() uint64 { return bootTicks(true) }}
}

// add records that pid was answered OK now.
func (r *registered) add(pid int) {
	now := r.now()
	r.mu.Lock()
	r.pids[pid] = now
	r.mu.Unlock()
}

// has reports whether pid registered: with this server, or (a process older than the server)
// as pids.config in configDir says. A process that is gone has not.
func (r *registered) has(pid int, configDir string) bool {
	start, err := ProcessStartTicks(r.proc, pid)
	if err != nil {
		return false
	}
	r.mu.Lock()
	at, ok := r.pids[pid]
	r.mu.Unlock()
	if ok && start <= at {
		return true
	}
	if start >= r.since || configDir == "" || !listedIn(filepath.Join(configDir, contract.PIDsConfigName), pid) {
		return false
	}
	// Remembered as of now: later checks need no read of the file.
	r.mu.Lock()
	r.pids[pid] = r.now()
	r.mu.Unlock()
	return true
}

// prune drops the entries of processes that are gone or whose PID was reused.
func (r *registered) prune() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for pid, at := range r.pids {
		if start, err := ProcessStartTicks(r.proc, pid); err != nil || start > at {
			delete(r.pids, pid)
		}
	}
}

// listedIn reports whether the pids.config at path lists pid.
func listedIn(path string, pid int) bool {
	return slices.Contains(readOwnPIDs(path), pid)
}

// readOwnPIDs reads the pids.config at path. The file is the registry's own (a container sees
// it read-only); it is read with contract §6's bound, never through a symlink, and anything
// malformed or missing lists nothing.
func readOwnPIDs(path string) []int {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil
	}
	buf := make([]byte, contract.MaxPIDsConfigBytes)
	n, _ := io.ReadFull(f, buf)
	pids, err := contract.ParsePIDs(buf[:n])
	if err != nil {
		return nil
	}
	return pids
}

// ProcessStartTicks reads a process's start time, in clock ticks since boot (field 22 of
// <proc>/<pid>/stat, after the command name, which may hold spaces and parentheses).
func ProcessStartTicks(proc string, pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	fields := bytes.Fields(b[i+1:])
	// fields[0] is field 3 (state): field 22 is fields[19].
	if len(fields) < 20 {
		return 0, fmt.Errorf("stat of pid %d has %d fields after the name", pid, len(fields))
	}
	return strconv.ParseUint(string(fields[19]), 10, 64)
}

// Registered reports whether the process registered with the node's registry (this server, or
// an earlier instance's as the container's pids.config in configDir records it). The
// enforcer's question; configDir may be empty.
func (s *Server) Registered(pid int, configDir string) bool {
	return s.registered.has(pid, configDir)
}
