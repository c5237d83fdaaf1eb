package arbiter

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// The wake path (contract §16, "Waking"): a container's library touches core.wake in its
// core-limit directory when it launches work after an idle spell; the arbiter watches those
// directories with inotify, and a guaranteed share that woke gets its request back at once
// instead of a pass or two later, when NVML has seen its work.

// Results of a wake (label "result" of arbiter_wakes_total, contract §8).
const (
	// WakeTaken: the wake re-divided the container's GPUs.
	WakeTaken = "taken"
	// WakeDropped: another wake of the container was taken less than MinWakeInterval ago.
	WakeDropped = "dropped"
	// WakeUnknown: the directory is of no target the last pass divided for (it ended).
	WakeUnknown = "unknown"
)

// MinWakeInterval is the least time between two wakes of one container that are taken: a
// container that writes its file in a loop costs the node at most this many re-divisions.
const MinWakeInterval = 10 * time.Millisecond

// wakeState is what the arbiter knows of wakes, under Arbiter.mu.
type wakeState struct {
	// hold is how long a wake counts: one core period.
	hold time.Duration
	// until is, per target, when its last taken wake stops counting.
	until map[string]time.Time
	// taken is, per target, when its last wake was taken (the rate bound).
	taken map[string]time.Time
	// pending are the targets woken since the last re-division.
	pending map[string]bool
	// kick tells the pass goroutine that a re-division is due.
	kick chan struct{}
	// onWake counts a wake by result; may be nil.
	onWake func(result string)
}

func newWakeState() wakeState {
	return wakeState{hold: 100 * time.Millisecond, until: map[string]time.Time{}, taken: map[string]time.Time{},
		pending: map[string]bool{}, kick: make(chan struct{}, 1)}
}

func (w *wakeState) woken(key string, now time.Time) bool {
	u, ok := w.until[key]
	return ok && now.Before(u)
}

// forget drops the state of targets the pass no longer has.
func (w *wakeState) forget(pass map[string]map[string]float64) {
	for key := range w.taken {
		if _, ok := pass[key]; !ok {
			delete(w.taken, key)
			delete(w.until, key)
			delete(w.pending, key)
		}
	}
}

// SetWakeHold sets how long a wake counts (the enforcer's core period) and the wake counter.
func (a *Arbiter) SetWakeHold(hold time.Duration, onWake func(result string)) {
	a.mu.Lock()
	a.wakes.hold, a.wakes.onWake = hold, onWake
	a.mu.Unlock()
}

// Wake records that the target's library said it has work now. Safe for concurrent use; the
// re-division itself runs in the pass goroutine (Redivide, on Kicks).
func (a *Arbiter) Wake(key string) string {
	now := a.now()
	a.mu.Lock()
	result := WakeTaken
	if _, known := a.lastAllowances[key]; !known {
		result = WakeUnknown
	} else if last, ok := a.wakes.taken[key]; ok && now.Sub(last) < MinWakeInterval {
		result = WakeDropped
	} else {
		a.wakes.taken[key] = now
		a.wakes.until[key] = now.Add(a.wakes.hold)
		a.wakes.pending[key] = true
	}
	onWake := a.wakes.onWake
	a.mu.Unlock()
	if result == WakeTaken {
		select {
		case a.wakes.kick <- struct{}{}:
		default:
		}
	}
	if onWake != nil {
		onWake(result)
	}
	return result
}

// Kicks is signalled when a wake waits for Redivide.
func (a *Arbiter) Kicks() <-chan struct{} { return a.wakes.kick }

// Redivide divides again, with the wakes taken since, every GPU of the last pass that a woken
// guaranteed share is on, and publishes the allowances that change. It must run where Divide
// and EndPass run (the enforcer's pass goroutine).
func (a *Arbiter) Redivide() {
	now := a.now()
	a.mu.Lock()
	pending := a.wakes.pending
	a.wakes.pending = map[string]bool{}
	changed := map[string]bool{}
	for gpu, in := range a.last {
		if !wokenGuaranteed(in, pending) {
			continue
		}
		shares := make([]Share, len(in))
		for i, x := range in {
			shares[i] = x.Share
			shares[i].Prev = a.current[x.Key][gpu].Allowance
			shares[i].Woken = a.wakes.woken(x.Key, now)
		}
		for i, v := range Divide(shares) {
			key := in[i].Key
			if m := a.lastAllowances[key]; m != nil && m[gpu] != v {
				m[gpu] = v
				changed[key] = true
				if st, ok := a.current[key][gpu]; ok {
					st.Allowance = v
					a.current[key][gpu] = st
				}
			}
		}
	}
	dirs := make(map[string][]string, len(changed))
	for key := range changed {
		dirs[key] = a.lastDirs[key]
	}
	a.mu.Unlock()
	for key := range changed {
		a.publish(key, a.lastAllowances[key], dirs[key])
	}
}

func wokenGuaranteed(in []Input, woken map[string]bool) bool {
	for _, x := range in {
		if woken[x.Key] && classOf(x.Share) == Guaranteed {
			return true
		}
	}
	return false
}

// watcher is the inotify instance that watches the targets' core-limit directories.
type watcher struct {
	fd   int
	file *os.File
	mu   sync.Mutex
	keys map[int32]string            // watch descriptor → target
	wds  map[string]map[string]int32 // target → directory → watch descriptor
}

const wakeMask = unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_CREATE | unix.IN_ATTRIB

// StartWaking watches the core-limit directories of the targets each pass divides for, until ctx
// ends. Without inotify (an error) the arbiter works pass by pass only.
func (a *Arbiter) StartWaking(ctx context.Context) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return err
	}
	w := &watcher{fd: fd, file: os.NewFile(uintptr(fd), "inotify"), keys: map[int32]string{}, wds: map[string]map[string]int32{}}
	a.mu.Lock()
	a.watch = w
	a.mu.Unlock()
	go func() {
		<-ctx.Done()
		_ = w.file.Close()
	}()
	go w.read(a)
	return nil
}

// syncWatch makes the watches those of the targets' directories (key → directories).
func (a *Arbiter) syncWatch(dirs map[string][]string) {
	a.mu.Lock()
	w := a.watch
	a.mu.Unlock()
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for key, have := range w.wds {
		for dir, wd := range have {
			if !slices.Contains(dirs[key], dir) {
				_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
				delete(w.keys, wd)
				delete(have, dir)
			}
		}
		if len(have) == 0 {
			delete(w.wds, key)
		}
	}
	for key, list := range dirs {
		for _, dir := range list {
			if _, ok := w.wds[key][dir]; ok {
				continue
			}
			wd, err := unix.InotifyAddWatch(w.fd, dir, wakeMask|unix.IN_ONLYDIR|unix.IN_DONT_FOLLOW)
			if err != nil {
				continue // gone, or the watch limit: the passes still divide
			}
			if w.wds[key] == nil {
				w.wds[key] = map[string]int32{}
			}
			w.wds[key][dir] = int32(wd)
			w.keys[int32(wd)] = key
		}
	}
}

// read takes events until the file is closed. An event's name is the container's to choose:
// it is only compared with core.wake.
func (w *watcher) read(a *Arbiter) {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			end := off + unix.SizeofInotifyEvent + int(ev.Len)
			if end > n {
				break
			}
			name := buf[off+unix.SizeofInotifyEvent : end]
			for len(name) > 0 && name[len(name)-1] == 0 {
				name = name[:len(name)-1]
			}
			off = end
			if ev.Mask&unix.IN_IGNORED != 0 {
				w.mu.Lock()
				delete(w.keys, ev.Wd)
				w.mu.Unlock()
				continue
			}
			if ev.Mask&wakeMask == 0 || string(name) != contract.CoreWakeName {
				continue
			}
			w.mu.Lock()
			key, ok := w.keys[ev.Wd]
			w.mu.Unlock()
			if ok {
				a.Wake(key)
			}
		}
	}
}
