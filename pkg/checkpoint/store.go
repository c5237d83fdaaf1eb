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

	// durable is what the file on disk holds. The pointed-to Data is never modified after it
	// is published; readers deep-copy from it.
	durable atomic.Pointer[Data]

	mu      sync.Mutex
	queue   []*update // mutations waiting for the next batch, in arrival order
	leading bool      // a leader is committing a batch; the next one is handed leadership

	// onDisk is the encoded data of the file as this Store last wrote it (nil before its
	// first write). Only the leader touches it; leadership passes under mu.
	onDisk []byte

	// sealed refuses every Update with ErrSealed (Seal); idle is closed whenever no batch is
	// being committed, so that Seal can wait for the last one.
	sealed bool
	idle   chan struct{}
}

// ErrSealed is Update's error on a store that Seal handed over to another instance (contract
// §14): the file belongs to the next owner, and this process must not write it again.
var ErrSealed = errors.New("checkpoint handed over to another plugin instance; this one no longer writes it")

// update is one caller's pending mutation and the channel its outcome arrives on.
type update struct {
	mutate func(*Data) error
	done   chan outcome // buffered: the sender never blocks
}

// outcome is what a waiting caller receives: its result, or leadership of the next batch.
type outcome struct {
	err        error
	lead       bool
	panicked   bool
	panicValue any
}

// Option changes how Open sets up the store.
type Option func(*Store)

// WithWriter names the writer recorded in the file instead of DefaultWriter.
func WithWriter(writer string) Option { return func(s *Store) { s.writer = writer } }

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
	s := &Store{path: path, writer: DefaultWriter(), write: fsutil.WriteFileAtomic, idle: closedChan()}
	for _, o := range opts {
		o(s)
	}
	s.durable.Store(&d)
	return s, nil
}

// Path returns the checkpoint file's path.
func (s *Store) Path() string { return s.path }

// Get returns a copy of the durable record of one claim.
func (s *Store) Get(claimUID string) (Claim, bool) {
	c, ok := s.durable.Load().Claims[claimUID]
	if !ok {
		return Claim{}, false
	}
	return c.DeepCopy(), true
}

// Len is the number of claims in the durable state, without copying it.
func (s *Store) Len() int { return len(s.durable.Load().Claims) }

// Snapshot returns a copy of the durable state: what the file on disk holds.
func (s *Store) Snapshot() Data {
	return s.durable.Load().DeepCopy()
}

// Update applies mutate to the state and makes the result durable before it returns nil.
// Concurrent calls are committed together (see the package documentation). If mutate
// returns an error, nothing it did is kept and that error is returned. If the write fails,
// the error says so and the durable state is unchanged. mutate may run on another caller's
// goroutine: it must be quick, do no I/O, not call the Store, not keep d or anything in it
// after it returns, and not call runtime.Goexit (t.FailNow). A panic in mutate is re-raised
// in the caller's goroutine.
func (s *Store) Update(mutate func(*Data) error) error {
	u := &update{mutate: mutate, done: make(chan outcome, 1)}
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
func (s *Store) lead(self *update) outcome {
	s.mu.Lock()
	batch := s.queue
	s.queue = nil
	s.mu.Unlock()

	results := s.commit(batch)

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

// commit applies a batch in order, each mutation to its own copy, writes the result once and
// publishes it. It returns each mutation's outcome, in batch order.
func (s *Store) commit(batch []*update) []outcome {
	results := make([]outcome, len(batch))
	working := s.durable.Load()
	var applied []int
	for i, u := range batch {
		trial := working.DeepCopy()
		if results[i] = apply(u.mutate, &trial); results[i].err != nil || results[i].panicked {
			continue
		}
		if trial.Claims == nil {
			trial.Claims = map[string]Claim{}
		}
		working = &trial
		applied = append(applied, i)
	}
	if len(applied) == 0 {
		return results
	}
	// Publish a copy: whatever the mutations kept references to can never reach the
	// durable state, which must not change once published.
	next := working.DeepCopy()
	if err := s.persist(next); err != nil {
		for _, i := range applied {
			results[i].err = err
		}
		return results
	}
	s.durable.Store(&next)
	return results
}

// apply runs one mutation, catching a panic so that the leader survives it.
func apply(mutate func(*Data) error, d *Data) (o outcome) {
	defer func() {
		if r := recover(); r != nil {
			o = outcome{panicked: true, panicValue: r}
		}
	}()
	return outcome{err: mutate(d)}
}

// persist writes d to the file unless the file already holds exactly that data.
func (s *Store) persist(d Data) error {
	dataBytes, file, err := encode(d, s.writer)
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
	if c, ok := s.durable.Load().Claims[claimUID]; ok && slices.Equal(c.ReservedFor, pods) {
		return nil
	}
	return s.Update(func(d *Data) error {
		c, ok := d.Claims[claimUID]
		if !ok {
			return fmt.Errorf("record reservedFor of claim %s: %w", claimUID, ErrNotPrepared)
		}
		c.ReservedFor = slices.Clone(pods)
		d.Claims[claimUID] = c
		return nil
	})
}

// Find returns a copy of the first claim (in no particular order) for which match is true.
// match sees the durable records without a copy: it must not keep or modify them.
func (s *Store) Find(match func(uid string, c *Claim) bool) (string, Claim, bool) {
	for uid, c := range s.durable.Load().Claims {
		if match(uid, &c) {
			return uid, c.DeepCopy(), true
		}
	}
	return "", Claim{}, false
}

// Seal stops this store from writing the file: every later Update fails with ErrSealed, and
// Seal returns once the updates already queued are committed (or ctx ends, with its error and
// the store unsealed again). After Seal the file on disk is final for this process: the next
// owner opens it (contract §14, the handover's fence).
func (s *Store) Seal(ctx context.Context) error {
	s.mu.Lock()
	s.sealed = true
	idle := s.idle
	s.mu.Unlock()
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
