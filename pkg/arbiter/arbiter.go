package arbiter

import (
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/fsutil"
)

// Arbiter divides each GPU's cores between the shares on it, pass after pass, and publishes each
// target's allowances in its config directory (contract §16). The node enforcer calls it from
// its compute pass, with the utilisation it has just read; it is not safe for concurrent use
// except for Allowances and Snapshot, which the metrics read.
type Arbiter struct {
	// write publishes a file; fsutil.WriteFileAtomic unless a test replaces it.
	write func(path string, data []byte) error
	// onError is told about a file that could not be written; may be nil.
	onError func(target, path string, err error)

	// now is the clock; time.Now unless a test replaces it.
	now func() time.Time

	// pass is the division in progress: target → GPU → allowance.
	pass map[string]map[string]float64
	dirs map[string][]string
	// last is each GPU's inputs of the last completed pass (the wake path divides them again),
	// and lastAllowances what that division gave each target.
	last, lastNext map[string][]Input
	lastAllowances map[string]map[string]float64
	lastDirs       map[string][]string
	// wakeDirs are the targets' core-limit directories, by key, for the wake watcher.
	wakeDirs map[string][]string

	mu sync.Mutex
	// current is the last completed pass's division, by target and GPU, with the share's terms.
	current map[string]map[string]Status
	// next is the pass in progress's.
	next map[string]map[string]Status
	// written is the content last published per target's file.
	written map[string]string
	// wakes is the wake path's state (wake.go), under mu; watch its inotify watcher, nil
	// until StartWaking.
	wakes wakeState
	watch *watcher
}

// Status is one target's share of one GPU after a pass: what the metrics and `kubectl vgpu` show.
type Status struct {
	Class                       Class
	Request, Ceiling, Allowance float64
	Util                        float64
}

// New returns an arbiter that writes files atomically. onError may be nil.
func New(onError func(target, path string, err error)) *Arbiter {
	return &Arbiter{
		write: func(path string, data []byte) error {
			return fsutil.WriteFileAtomic(path, data, contract.CoreAllowanceMode)
		},
		onError: onError,
		now:     time.Now,
		pass:    map[string]map[string]float64{},
		last:    map[string][]Input{}, lastNext: map[string][]Input{},
		lastAllowances: map[string]map[string]float64{}, lastDirs: map[string][]string{}, wakeDirs: map[string][]string{},
		wakes:   newWakeState(),
		dirs:    map[string][]string{},
		current: map[string]map[string]Status{},
		next:    map[string]map[string]Status{},
		written: map[string]string{},
	}
}

// Input is one target on one GPU in a pass.
type Input struct {
	Share
	// ConfigDirs are the target's host config directories, where its allowance file goes (a
	// device-plugin pod has one per container); none: nowhere (the enforcer still holds it to
	// the allowance).
	ConfigDirs []string
	// WakeDirs are its host core-limit directories, where its library signals that it has work
	// (core.wake, contract §16); none: its wakes are not watched.
	WakeDirs []string
}

// Divide divides one GPU between the inputs of this pass and returns each one's allowance.
// Prev comes from the arbiter's own memory: what an input carries is ignored.
func (a *Arbiter) Divide(gpu string, in []Input) []float64 {
	shares := make([]Share, len(in))
	now := a.now()
	a.mu.Lock()
	for i, x := range in {
		shares[i] = x.Share
		shares[i].Prev = a.current[x.Key][gpu].Allowance
		shares[i].Woken = a.wakes.woken(x.Key, now)
	}
	a.mu.Unlock()
	out := Divide(shares)
	a.lastNext[gpu] = slices.Clone(in)
	for i, x := range in {
		m := a.pass[x.Key]
		if m == nil {
			m = map[string]float64{}
			a.pass[x.Key] = m
		}
		m[gpu] = out[i]
		if len(x.ConfigDirs) > 0 {
			a.dirs[x.Key] = x.ConfigDirs
		}
		if len(x.WakeDirs) > 0 {
			a.wakeDirs[x.Key] = x.WakeDirs
		}
		req, ceil := terms(x.Share)
		a.record(x.Key, gpu, Status{Class: classOf(x.Share), Request: req, Ceiling: ceil, Allowance: out[i], Util: x.Util})
	}
	return out
}

func (a *Arbiter) record(key, gpu string, s Status) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.next[key]
	if m == nil {
		m = map[string]Status{}
		a.next[key] = m
	}
	m[gpu] = s
}

// EndPass publishes the pass's division: each target's allowance file is rewritten when its
// content changed, and the targets no pass divided for are forgotten (their directories went
// with their containers).
func (a *Arbiter) EndPass() {
	for key, gpus := range a.pass {
		a.publish(key, gpus, a.dirs[key])
	}
	a.mu.Lock()
	a.current, a.next = a.next, map[string]map[string]Status{}
	for key := range a.written {
		if _, ok := a.pass[key]; !ok {
			delete(a.written, key)
		}
	}
	a.wakes.forget(a.pass)
	a.last, a.lastNext = a.lastNext, map[string][]Input{}
	a.lastAllowances, a.lastDirs = a.pass, a.dirs
	a.mu.Unlock()
	a.syncWatch(a.wakeDirs)
	a.pass, a.dirs, a.wakeDirs = map[string]map[string]float64{}, map[string][]string{}, map[string][]string{}
}

// publish writes one target's allowances to its directories when they changed; a failed write
// is tried again at the next change or pass.
func (a *Arbiter) publish(key string, gpus map[string]float64, dirs []string) {
	data := string(contract.EncodeCoreAllowances(gpus))
	a.mu.Lock()
	same := a.written[key] == data
	a.mu.Unlock()
	if same || len(dirs) == 0 {
		return
	}
	ok := true
	for _, dir := range dirs {
		path := filepath.Join(dir, contract.CoreAllowanceName)
		if err := a.write(path, []byte(data)); err != nil {
			ok = false
			if a.onError != nil {
				a.onError(key, path, err)
			}
		}
	}
	if ok {
		a.mu.Lock()
		a.written[key] = data
		a.mu.Unlock()
	}
}

// Allowance is the target's allowance on the GPU after the last pass; false when it has none.
func (a *Arbiter) Allowance(key, gpu string) (float64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.current[key][gpu]
	return s.Allowance, ok
}

// Snapshot is the last pass's division: target key → GPU → status.
func (a *Arbiter) Snapshot() map[string]map[string]Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]map[string]Status, len(a.current))
	for k, m := range a.current {
		c := make(map[string]Status, len(m))
		for g, s := range m {
			c[g] = s
		}
		out[k] = c
	}
	return out
}
