package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/fsutil"
)

// fileMode is the checkpoint's mode: it names every prepared claim and pod on the node.
const fileMode os.FileMode = 0o600

// Store is the checkpoint file and its durable content in memory. Its methods are safe for
// concurrent use. Only one Store may write a given file (the instance lock guarantees one
// plugin per node).
type Store struct {
	path string
	// writer is written into the file's envelope (DefaultWriter unless WithWriter says).
	writer string
	// write replaces the file; fsutil.WriteFileAtomic except in tests that count writes.
	write func(path string, data []byte, perm os.FileMode) error

	// view is what readers see: the durable state less the claims RemoveDeferred removed and no
	// write has carried yet. A published view and everything it points to never change: the next
	// one shares every claim record that did not change (copy-on-write, cow.go), and Get and
	// Snapshot deep-copy from it. It is replaced under mu.
	view atomic.Pointer[view]

	mu      sync.Mutex
	queue   []*update // mutations waiting for the next batch, in arrival order
	leading bool      // a leader is committing a batch; the next one is handed leadership

	// flushDelay is how long a deferred removal may wait for a write to carry it;
	// afterFunc schedules that write (time.AfterFunc unless a test says otherwise).
	flushDelay time.Duration
	afterFunc  func(time.Duration, func())
	// flushPending: a flush is scheduled; closed: Close ran, nothing more is scheduled. Both
	// under mu.
	flushPending, closed bool

	// onDisk is the encoded data of the file as this Store last wrote it (nil before its
	// first write). Only the leader touches it and enc; leadership passes under mu.
	onDisk []byte
	enc    *claimEncoder

	// sealed refuses every Update with ErrSealed (Seal); idle is closed whenever no batch is
	// being committed, so that Seal can wait for the last one.
	sealed bool
	idle   chan struct{}
}

// ErrSealed is Update's error on a store that Seal handed over to another instance (contract
// §14): the file belongs to the next owner, and this process must not write it again.
var ErrSealed = errors.New("checkpoint handed over to another plugin instance; this one no longer writes it")

// update is one caller's pending change to the batch's state and the channel its outcome
// arrives on. apply either changes the state and returns nil, or leaves it as it was and returns
// an error (or panics).
type update struct {
	apply func(*batchState) error
	done  chan outcome // buffered: the sender never blocks
}

// outcome is what a waiting caller receives: its result, or leadership of the next batch.
type outcome struct {
	err        error
	lead       bool
	panicked   bool
	panicValue any
}

// DefaultFlushDelay is how long a removal by RemoveDeferred waits, at most, for a write that
// carries it: any durable Update within that time does, and costs nothing more.
const DefaultFlushDelay = time.Second

// Option changes how Open sets up the store.
type Option func(*Store)

// WithWriter names the writer recorded in the file instead of DefaultWriter.
func WithWriter(writer string) Option { return func(s *Store) { s.writer = writer } }

// WithFlushDelay sets how long a deferred removal waits, at most, before a write of its own
// carries it (DefaultFlushDelay otherwise), and the function that schedules that write
// (time.AfterFunc when nil): tests run it when they choose.
func WithFlushDelay(delay time.Duration, afterFunc func(time.Duration, func())) Option {
	return func(s *Store) {
		s.flushDelay = delay
		if afterFunc != nil {
			s.afterFunc = afterFunc
		}
	}
}

// Open loads the checkpoint at path. A missing file is an empty checkpoint; a file that
// cannot be trusted is a *CorruptError, one in a newer format than this package reads a
// *VersionError. A file of an older format is read as it is and rewritten in the format its
// data needs at the next update. The directory must already exist. Temporary files left by a
// write that a crash interrupted are removed.
func Open(path string, opts ...Option) (*Store, error) {
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint %s: directory %s: %w", path, dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("open checkpoint %s: %s is not a directory: %w", path, dir, syscall.ENOTDIR)
	}
	if err := fsutil.RemoveTempFiles(path); err != nil {
		return nil, fmt.Errorf("open checkpoint %s: %w", path, err)
	}
	d := Data{Claims: map[string]Claim{}}
	content, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read checkpoint %s: %w", path, err)
	default:
		if d, err = decode(path, content); err != nil {
			return nil, err
		}
	}
	s := &Store{path: path, writer: DefaultWriter(), write: fsutil.WriteFileAtomic, enc: newClaimEncoder(),
		flushDelay: DefaultFlushDelay, afterFunc: func(d time.Duration, f func()) { time.AfterFunc(d, f) },
		idle: closedChan()}
	for _, o := range opts {
		o(s)
	}
	s.view.Store(newView(&d, totalsOf(d.Claims), nil))
	return s, nil
}

// Path returns the checkpoint file's path.
func (s *Store) Path() string { return s.path }

// Get returns a copy of the record of one claim. A claim that RemoveDeferred removed is gone
// at once, before a write carries the removal.
func (s *Store) Get(claimUID string) (Claim, bool) {
	c, ok := s.view.Load().get(claimUID)
	if !ok {
		return Claim{}, false
	}
	return c.DeepCopy(), true
}

// Len is the number of claims, without copying them.
func (s *Store) Len() int {
	v := s.view.Load()
	n := len(v.durable.Claims)
	for uid := range v.removed {
		if _, ok := v.durable.Claims[uid]; ok {
			n--
		}
	}
	return n
}

// Snapshot returns a copy of the state: what the file on disk holds, less the claims that
// RemoveDeferred removed and no write has carried yet.
func (s *Store) Snapshot() Data {
	v := s.view.Load()
	d := v.durable.DeepCopy()
	for uid := range v.removed {
		delete(d.Claims, uid)
	}
	return d
}

// Update applies mutate to the state and makes the result durable before it returns nil.
// Concurrent calls are committed together (see the package documentation). If mutate
// returns an error, nothing it did is kept and that error is returned. If the write fails,
// the error says so and the durable state is unchanged. mutate may run on another caller's
// goroutine: it must be quick, do no I/O, not call the Store, not keep d or anything in it
// after it returns, and not call runtime.Goexit (t.FailNow). A panic in mutate is re-raised
// in the caller's goroutine.
//
// d's claims map is mutate's own, but the records in it are the durable ones, shared with
// every reader (copy-on-write): mutate may add, replace and delete claims in the map, and must
// never modify a record's slices (ReservedFor, Devices, a device's CDIDeviceIDs) in place. To
// change a claim, build the new record with slices of its own and store it under its UID. The
// store keeps a copy of each record mutate added or replaced, not the caller's slices.
//
// Update copies the claims map for mutate; Put and SetReservedFor do not, and are what Prepare
// uses.
func (s *Store) Update(mutate func(*Data) error) error {
	return s.enqueue(func(b *batchState) error {
		trial := b.data()
		if err := mutate(&trial); err != nil {
			return err
		}
		b.absorb(trial)
		return nil
	})
}

// Put records c as the claim uid (added, or replacing its record) and makes it durable before it
// returns nil, as Update does, without copying the claims map: the store keeps a copy of c.
func (s *Store) Put(uid string, c Claim) error {
	c = c.DeepCopy()
	return s.enqueue(func(b *batchState) error {
		b.put(uid, c)
		return nil
	})
}

// enqueue queues apply for the next batch and returns its outcome once the batch is committed.
func (s *Store) enqueue(apply func(*batchState) error) error {
	u := &update{apply: apply, done: make(chan outcome, 1)}
	s.mu.Lock()
	if s.sealed {
		s.mu.Unlock()
		return fmt.Errorf("update checkpoint %s: %w", s.path, ErrSealed)
	}
	s.queue = append(s.queue, u)
	lead := !s.leading
	if lead {
		s.idle = make(chan struct{})
	}
	s.leading = true
	s.mu.Unlock()
	if !lead {
		if o := <-u.done; !o.lead {
			return o.result()
		}
	}
	return s.lead(u).result()
}

// result turns an outcome into Update's return value.
func (o outcome) result() error {
	if o.panicked {
		panic(o.panicValue)
	}
	return o.err
}

// lead commits the queued batch, which holds self, hands leadership on and wakes the batch.
// The batch carries every deferred removal made before it was taken.
func (s *Store) lead(self *update) outcome {
	s.mu.Lock()
	batch := s.queue
	s.queue = nil
	removed := s.view.Load().removed
	s.mu.Unlock()

	results := s.commit(batch, removed)

	var next *update
	s.mu.Lock()
	if len(s.queue) > 0 {
		next = s.queue[0]
	} else {
		s.leading = false
		close(s.idle)
	}
	s.mu.Unlock()
	if next != nil {
		next.done <- outcome{lead: true}
	}

	var own outcome
	for i, u := range batch {
		if u == self {
			own = results[i]
			continue
		}
		u.done <- results[i]
	}
	return own
}

// commit applies the deferred removals and then the batch in order to one copy-on-write state
// (cow.go), writes the result once and publishes it. It returns each update's outcome, in batch
// order. An update that fails leaves the state as it found it.
func (s *Store) commit(batch []*update, removed map[string]struct{}) []outcome {
	results := make([]outcome, len(batch))
	old := s.view.Load()
	b := newBatchState(old.durable)
	for uid := range removed {
		b.delete(uid)
	}
	var applied []int
	for i, u := range batch {
		if results[i] = apply(u.apply, b); results[i].err != nil || results[i].panicked {
			continue
		}
		applied = append(applied, i)
	}
	if len(applied) == 0 && len(removed) == 0 {
		return results
	}
	// The new state shares every unchanged record with the old one; the records the batch
	// put are the store's own copies, so nothing a caller holds can reach it.
	next := b.data()
	if err := s.persist(next); err != nil {
		for _, i := range applied {
			results[i].err = err
		}
		return results
	}
	s.mu.Lock()
	// Removals made while the file was written wait for the next write.
	var still map[string]struct{}
	for uid := range s.view.Load().removed {
		if _, carried := removed[uid]; !carried {
			if still == nil {
				still = map[string]struct{}{}
			}
			still[uid] = struct{}{}
		}
	}
	s.view.Store(newView(&next, old.durableTotals.applied(old.durable, b.changed), still))
	s.mu.Unlock()
	return results
}

// apply runs one update, catching a panic so that the leader survives it.
func apply(update func(*batchState) error, b *batchState) (o outcome) {
	defer func() {
		if r := recover(); r != nil {
			o = outcome{panicked: true, panicValue: r}
		}
	}()
	return outcome{err: update(b)}
}

// persist writes d to the file unless the file already holds exactly that data.
func (s *Store) persist(d Data) error {
	dataBytes, file, err := encode(s.enc, d, s.writer)
	if err != nil {
		return fmt.Errorf("write checkpoint %s: %w", s.path, err)
	}
	if s.onDisk != nil && bytes.Equal(dataBytes, s.onDisk) {
		return nil
	}
	if err := s.write(s.path, file, fileMode); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", s.path, err)
	}
	s.onDisk = dataBytes
	return nil
}

// ErrNotPrepared says that a claim is not in the checkpoint.
var ErrNotPrepared = errors.New("claim is not prepared")

// SetReservedFor records pods (sorted pod UIDs) as the pods the claim is reserved for, and
// writes only when the record says otherwise. Prepare (a repeated call for a second pod) and the
// NRI plugin (a reservedFor re-read from the API server) both keep the record current through it.
func (s *Store) SetReservedFor(claimUID string, pods []string) error {
	if c, ok := s.view.Load().get(claimUID); ok && slices.Equal(c.ReservedFor, pods) {
		return nil
	}
	pods = slices.Clone(pods)
	return s.enqueue(func(b *batchState) error {
		c, ok := b.get(claimUID)
		if !ok {
			return fmt.Errorf("record reservedFor of claim %s: %w", claimUID, ErrNotPrepared)
		}
		// A new record: its devices are the old record's (immutable), its pods its own.
		c.ReservedFor = pods
		b.put(claimUID, c)
		return nil
	})
}

// Find returns a copy of the first claim (in no particular order) for which match is true.
// match sees the records without a copy: it must not keep or modify them.
func (s *Store) Find(match func(uid string, c *Claim) bool) (string, Claim, bool) {
	v := s.view.Load()
	for uid, c := range v.durable.Claims {
		if _, gone := v.removed[uid]; gone {
			continue
		}
		if match(uid, &c) {
			return uid, c.DeepCopy(), true
		}
	}
	return "", Claim{}, false
}

// Range calls fn for every claim, in no particular order, without copying: fn must not keep or
// modify what it is given. Prepare's capacity check reads every claim through it.
func (s *Store) Range(fn func(uid string, c *Claim)) {
	v := s.view.Load()
	for uid, c := range v.durable.Claims {
		if _, gone := v.removed[uid]; gone {
			continue
		}
		fn(uid, &c)
	}
}

// Seal stops this store from writing the file: every later Update fails with ErrSealed, and
// Seal returns once the updates already queued are committed (or ctx ends, with its error and
// the store unsealed again). After Seal the file on disk is final for this process: the next
// owner opens it (contract §14, the handover's fence).
//
// The removals RemoveDeferred made are written first: the next owner reads the file, and a
// claim this instance unprepared must not be in it. The caller has stopped everything that
// unprepares (the handover's gates, the reconciliation), so the loop ends at once.
func (s *Store) Seal(ctx context.Context) error {
	var idle chan struct{}
	for {
		if err := s.Flush(); err != nil {
			return fmt.Errorf("seal checkpoint %s: %w", s.path, err)
		}
		s.mu.Lock()
		if len(s.view.Load().removed) == 0 {
			s.sealed = true
			idle = s.idle
			s.mu.Unlock()
			break
		}
		s.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("seal checkpoint %s: %w", s.path, context.Cause(ctx))
		}
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		s.Unseal()
		return fmt.Errorf("seal checkpoint %s: updates still being written: %w", s.path, context.Cause(ctx))
	}
}

// Unseal lets Update write again (a handover that was called off before the file changed hands).
func (s *Store) Unseal() {
	s.mu.Lock()
	s.sealed = false
	if len(s.view.Load().removed) > 0 && !s.flushPending && !s.closed {
		s.flushPending = true
		s.afterFunc(s.flushDelay, s.flushLater)
	}
	s.mu.Unlock()
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// Load reads and checks the checkpoint at path without taking it over: unlike Open it removes
// nothing (a temporary file may be the owner's write in progress) and returns the data, not a
// store. A successor uses it to learn, before it asks for the node, whether it can read what the
// owner wrote (contract §14): the errors are Open's (*CorruptError, *VersionError).
func Load(path string) (Data, error) {
	content, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Data{Claims: map[string]Claim{}}, nil
	case err != nil:
		return Data{}, fmt.Errorf("read checkpoint %s: %w", path, err)
	}
	return decode(path, content)
}
