package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/handover"
	"github.com/vgpu-dra/vgpu-dra/pkg/instancelock"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// This file is the plugin's side of contract §14: the owner's answers to a successor
// (handoverOwner), the successor's steps (handoverSuccessor), the loop of an instance that does
// not own the node (observe), and what NRI asks about ownership (nriOwnership, nriDecisions).

// How an observer waits (contract §14).
const (
	// observePoll is how often an observer looks at the lock: the owner may have died.
	observePoll = 100 * time.Millisecond
	// sequentialPoll is how often an instance waiting for a lock whose holder speaks no
	// handover protocol looks at it.
	sequentialPoll = 250 * time.Millisecond
	// retryAfterCalledOff and retryAfterUnreadable pace a successor's requests after the owner
	// called one off (a call in flight did not finish in time), or after it could not read the
	// checkpoint (a format newer than it reads: only the owner changing it helps).
	retryAfterCalledOff  = time.Second
	retryAfterUnreadable = 30 * time.Second
	// retryAfterFailedTakeOver caps the wait after this instance took the lock and failed to
	// build the owner's parts (a bad configuration of the new version, most likely): each try
	// costs the old owner a pause.
	retryAfterFailedTakeOver = 5 * time.Minute
	// takeLockTimeout bounds the successor's wait for the lock the owner said it released.
	takeLockTimeout = 2 * time.Second
	// marksLinger is how long after a takeover the new owner still reads its predecessor's
	// marks (they are read within one runtime call sequence, milliseconds).
	marksLinger = time.Minute
	// undecidedMargin is kept of the runtime's deadline by a CreateContainer held by a handover:
	// failing it before the runtime gives up makes containerd fail the container (the kubelet
	// retries) instead of dropping this plugin and creating it without us.
	undecidedMargin = 300 * time.Millisecond
)

var _ handover.Owner = handoverOwner{}
var _ handover.Successor = handoverSuccessor{}

// handoverOwner answers a successor while this instance owns the node.
type handoverOwner struct{ p *Plugin }

func (o handoverOwner) Welcome(h handover.Hello) (handover.Welcome, error) {
	p := o.p
	if p.stopping.Load() {
		return handover.Welcome{}, &handover.RefusedError{Reason: "this instance is stopping; take the node when the lock is free"}
	}
	if h.PodUID == "" || h.PodUID == p.cfg.PodUID {
		return handover.Welcome{}, &handover.RefusedError{Reason: fmt.Sprintf("successor pod %q is not another pod", h.PodUID)}
	}
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	if slices.Contains(p.state.predecessors, h.PodUID) {
		return handover.Welcome{}, &handover.RefusedError{Retired: true, Reason: "pod " + h.PodUID + " handed this node over to this instance"}
	}
	// Marks on before the successor learns the NRI index: every CreateContainer it can be
	// called for is decided with a mark.
	p.state.peer = true
	return handover.Welcome{PodUID: p.cfg.PodUID, NRIIndex: p.nriIndex(), NRIConnected: p.nri != nil && p.nri.supervisor.Synced()}, nil
}

func (o handoverOwner) Fence(ctx context.Context) error {
	p := o.p
	p.inHandover.Add(1)
	t := p.term.Load()
	if t == nil || p.stopping.Load() {
		return errors.New("this instance is stopping")
	}
	p.step("fence")
	t.fencedAt = time.Now()
	t.heldBefore = p.draGate.HeldTotal() + p.nriGate.HeldTotal()
	if err := p.draGate.Close(ctx); err != nil {
		return fmt.Errorf("kubelet calls in flight: %w", err)
	}
	if err := p.nriGate.Close(ctx); err != nil {
		return fmt.Errorf("CreateContainers in flight: %w", err)
	}
	if err := t.stopReconcile(ctx); err != nil {
		return err
	}
	if err := t.store.Seal(ctx); err != nil {
		return err
	}
	p.step("fenced")
	return nil
}

func (o handoverOwner) Unfence() {
	p := o.p
	defer p.inHandover.Add(-1)
	if t := p.term.Load(); t != nil {
		t.store.Unseal()
		if t.reconcileStopped() {
			t.startReconcile()
		}
	}
	p.draGate.Own()
	p.nriGate.Own()
	p.hm.Events.WithLabelValues(metrics.EventCalledOff).Inc()
	p.step("unfenced")
}

func (o handoverOwner) Release() error {
	p := o.p
	p.roleMu.Lock()
	defer p.roleMu.Unlock()
	t := p.term.Load()
	if t == nil {
		return errors.New("this instance does not own the node")
	}
	p.step("release")
	// Everything only the owner may run ends here; the registry keeps answering until the new
	// owner's socket is in place (Took), and the gates keep holding calls until then.
	t.handover.Close()
	t.stopSockets()
	t.cancel()
	t.publisher.Stop()
	p.delegate.set(nil, nil)
	p.term.Store(nil)
	p.retiredOld = append(p.retiredOld, t)
	p.stateMu.Lock()
	p.state.retired = true
	p.stateMu.Unlock()
	p.hm.Owner.Set(0)
	_ = t.lock.Release()
	p.logStep().Info("Released the node to the successor")
	p.step("released")
	return nil
}

func (o handoverOwner) Took(took *handover.Took) handover.Report {
	p := o.p
	defer p.inHandover.Add(-1)
	p.roleMu.Lock()
	t := p.retiredOld[len(p.retiredOld)-1]
	pause := time.Since(t.fencedAt)
	held := p.draGate.HeldTotal() + p.nriGate.HeldTotal() - t.heldBefore
	// The successor's registry socket is in place (or nobody's is and the lock decides):
	// answer what this one accepted and take nothing new.
	t.registry.Yield()
	p.draGate.Observe()
	p.nriGate.Observe()
	p.roleMu.Unlock()
	if took != nil {
		p.hm.Events.WithLabelValues(metrics.EventHandedOver).Inc()
		p.hm.Pause.Observe(pause.Seconds())
		p.logStep().Info("Handed the node over", "pause", pause, "heldCalls", held, "newDRASocket", took.DRASocket)
	} else {
		p.hm.Events.WithLabelValues(metrics.EventNotTaken).Inc()
		p.logStep().Info("Released the node but the successor did not confirm; whoever holds the lock next owns it (this instance takes it back when it is free)")
	}
	p.step("took")
	// Observe from here on: take the node back whenever the lock is free (the successor died).
	if !p.stopping.Load() {
		p.observer.Add(1)
		go p.observe()
	}
	return handover.Report{Pause: pause, HeldCalls: held}
}

func (o handoverOwner) PeerGone() {
	p := o.p
	p.stateMu.Lock()
	p.state.peer = false
	p.stateMu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// handoverSuccessor takes the node over from the owner in pod owner.
type handoverSuccessor struct {
	p     *Plugin
	owner string
}

func (s handoverSuccessor) Validate() error {
	p := s.p
	p.step("validate")
	if _, err := p.deps.LoadCheckpoint(p.cfg.CheckpointPath()); err != nil {
		return fmt.Errorf("cannot read the checkpoint the owner left: %w", err)
	}
	// From the commit on, the lock may be free any moment because the owner released it:
	// whoever in this process takes it, takes the node over (its marks are to be honoured).
	p.stateMu.Lock()
	p.state.expecting = true
	p.state.tookAt = time.Now()
	p.stateMu.Unlock()
	return nil
}

func (s handoverSuccessor) TakeOver(ctx context.Context) (handover.Took, error) {
	p := s.p
	p.inHandover.Add(1)
	defer p.inHandover.Add(-1)
	p.step("take")
	took := handover.Took{DRASocket: p.cfg.DRASocket()}
	ctx, cancel := context.WithTimeout(ctx, takeLockTimeout)
	defer cancel()
	for {
		if p.Owner() {
			// An NRI call took the lock the moment it was free (nriOwnership.Enter).
			s.record()
			return took, nil
		}
		p.roleMu.Lock()
		if p.term.Load() == nil {
			lock, err := instancelock.TryAcquire(p.cfg.InstanceLockPath())
			if err == nil {
				err = p.becomeOwner(lock, p.nriIndex(), metrics.EventTookOver)
				p.roleMu.Unlock()
				if err != nil {
					return handover.Took{}, &takeOverError{err}
				}
				s.record()
				p.step("owner")
				return took, nil
			}
			if !errors.Is(err, instancelock.ErrHeld) {
				p.roleMu.Unlock()
				return handover.Took{}, err
			}
		}
		p.roleMu.Unlock()
		select {
		case <-ctx.Done():
			return handover.Took{}, fmt.Errorf("the instance lock was not free within %v", takeLockTimeout)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (s handoverSuccessor) record() {
	p := s.p
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	if !slices.Contains(p.state.predecessors, s.owner) {
		p.state.predecessors = append(p.state.predecessors, s.owner)
	}
	p.state.expecting = false
	p.state.tookAt = time.Now()
}

// takeOverError is a failure to build the owner's parts after the lock changed hands: the old
// owner takes the node back, and asking again soon would only cost it another pause.
type takeOverError struct{ error }

func (e *takeOverError) Unwrap() error { return e.error }

// tryOwn takes the node if the lock is free (the owner exited or died) and reports whether this
// instance owns it now. A failure to build the owner's parts is fatal to the process: nobody
// else would own the node.
func (p *Plugin) tryOwn() bool {
	if p.Owner() {
		return true
	}
	if p.stopping.Load() {
		return false
	}
	p.roleMu.Lock()
	defer p.roleMu.Unlock()
	if p.term.Load() != nil {
		return true
	}
	lock, err := instancelock.TryAcquire(p.cfg.InstanceLockPath())
	if err != nil {
		return false
	}
	p.stateMu.Lock()
	sequential, expecting := p.state.sequential, p.state.expecting
	p.stateMu.Unlock()
	if sequential {
		p.logger.Info("Took over the instance lock", "lock", p.cfg.InstanceLockPath())
	}
	index := p.nriIndex()
	if p.nri != nil && !p.nri.started() {
		index = p.cfg.NRIPluginIndex
	}
	event := metrics.EventOwnerGone
	if expecting {
		// The owner released the lock to this instance a moment ago (the successor's TakeOver
		// follows): a handover, whose marks stand.
		event = metrics.EventTookOver
	} else if p.markers != nil {
		// The owner died. A mark it left may be of a CreateContainer it never answered; deciding
		// that container again is the lesser harm (a container with two adjustments fails and
		// the kubelet retries it; one with none would run without its limits' directories).
		_, _ = p.markers.Sweep(0)
	}
	if err := p.becomeOwner(lock, index, event); err != nil {
		p.logger.Error(err, "Taking the node over from an owner that went failed")
		p.fail(fmt.Errorf("take the node over: %w", err))
		return false
	}
	p.logger.Info("Kubelet plugin started", "driver", p.cfg.DriverName, "node", p.cfg.NodeName, "vgpu", p.cfg.VGPU, "nri", p.cfg.NRI)
	return true
}

// observe is the loop of an instance that does not own the node: it takes the node when the
// lock is free, asks a handover-speaking owner for it when ready (unless this instance handed it
// over itself), and otherwise waits.
func (p *Plugin) observe() {
	defer p.observer.Done()
	var (
		client  *handover.Client
		welcome handover.Welcome
		owner   string
		wait    time.Duration
		backoff = retryAfterCalledOff
		logged  bool
	)
	defer func() {
		if client != nil {
			client.Close()
		}
	}()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.kick:
		case <-time.After(wait):
		}
		wait = observePoll
		if p.tryOwn() || p.ctx.Err() != nil {
			return
		}
		p.stateMu.Lock()
		retired := p.state.retired
		p.stateMu.Unlock()
		if retired {
			continue
		}
		holder := instancelock.ReadHolder(p.cfg.InstanceLockPath())
		rec, speaks := handover.ParseRecord(holder.Record)
		if !p.cfg.HandoverEnabled() || !speaks || rec.PodUID == "" {
			if !logged {
				p.logger.Info("Another plugin instance holds the instance lock; waiting for it to exit (it does not hand the node over: one instance per node, two would both write the checkpoint, serve the registry and inject NRI mounts)",
					"lock", p.cfg.InstanceLockPath(), "holderPID", holder.PID)
				logged = true
			}
			p.setObserving(true, "the owner does not hand over; this instance takes the node when it exits")
			wait = sequentialPoll
			continue
		}
		if client != nil && owner != rec.PodUID {
			client.Close()
			client = nil
		}
		if client == nil {
			var err error
			if client, welcome, err = p.greet(); err != nil {
				var refused *handover.RefusedError
				switch {
				case errors.As(err, &refused) && refused.Retired:
					p.logStep().Info("This instance handed the node over before; it takes it back only if the owner goes", "owner", rec.PodUID)
					p.stateMu.Lock()
					p.state.retired = true
					p.stateMu.Unlock()
				case errors.Is(err, errNoIndexLeft):
					p.setObserving(true, err.Error())
				default:
					p.setObserving(false, "cannot reach the owner's handover socket: "+err.Error())
					wait = backoff
				}
				continue
			}
			owner = rec.PodUID
			p.logStep().Info("Observing the node's owner; taking over once ready", "owner", owner, "ownerNRIIndex", welcome.NRIIndex, "nriIndex", p.nriIndex())
		}
		if why := p.notReady(welcome); why != "" {
			p.setObserving(false, why)
			continue
		}
		report, err := client.Request(p.ctx, handoverSuccessor{p: p, owner: owner})
		p.stateMu.Lock()
		p.state.expecting = false
		p.stateMu.Unlock()
		if err == nil || errors.Is(err, handover.ErrTookOver) || p.Owner() {
			if err == nil {
				p.hm.Pause.Observe(report.Pause.Seconds())
			}
			p.logStep().Info("Took the node over", "from", owner, "pause", report.Pause, "heldCalls", report.HeldCalls, "err", err)
			return
		}
		p.hm.Events.WithLabelValues(metrics.EventCalledOff).Inc()
		p.setObserving(false, "handover called off: "+err.Error())
		p.logStep().Info("Handover called off; the owner keeps serving", "owner", owner, "reason", err.Error())
		var abort *handover.AbortError
		unreadable := isUnreadable(err)
		if !errors.As(err, &abort) && !unreadable {
			// A timeout or a lost connection: what the owner did is unknown; start afresh.
			client.Close()
			client = nil
		}
		var failed *takeOverError
		switch {
		case unreadable:
			wait = retryAfterUnreadable
		case errors.As(err, &failed):
			wait = max(retryAfterUnreadable, backoff)
			backoff = min(2*wait, retryAfterFailedTakeOver)
		default:
			wait = backoff
			backoff = min(2*backoff, 10*time.Second)
		}
	}
}

// isUnreadable reports whether err says that this instance cannot read the checkpoint (a
// downgrade past a format change, contract §7): only the owner changing the file helps.
func isUnreadable(err error) bool {
	var ve *checkpoint.VersionError
	var ce *checkpoint.CorruptError
	return errors.As(err, &ve) || errors.As(err, &ce)
}

// errNoIndexLeft: the owner's NRI index is the last one; this instance cannot register after it.
var errNoIndexLeft = errors.New("the owner uses NRI plugin index 99: no index is left after it, so this instance takes the node when the owner exits")

// greet dials the owner and introduces this instance; with NRI it registers with the runtime one
// index after the owner, so that the runtime calls the owner first for every container
// (contract §14, "Exactly once").
func (p *Plugin) greet() (*handover.Client, handover.Welcome, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 2*time.Second)
	defer cancel()
	c, err := handover.Dial(ctx, p.cfg.HandoverSocketPath())
	if err != nil {
		return nil, handover.Welcome{}, err
	}
	w, err := c.Hello(handover.Hello{PodUID: p.cfg.PodUID})
	if err != nil {
		c.Close()
		return nil, handover.Welcome{}, err
	}
	if p.nri != nil && !p.nri.started() {
		// An owner without NRI (NRISupport off) has no index: the runtime calls no other
		// plugin of ours, so this instance takes its configured one.
		next := p.cfg.NRIPluginIndex
		if w.NRIIndex != "" {
			if next, err = nextIndex(w.NRIIndex); err != nil {
				c.Close()
				return nil, handover.Welcome{}, err
			}
		}
		p.nri.start(p.ctx, next, p.health)
	}
	return c, w, nil
}

// nextIndex is the NRI plugin index after idx.
func nextIndex(idx string) (string, error) {
	n, err := strconv.Atoi(idx)
	if err != nil || len(idx) != 2 {
		return "", fmt.Errorf("the owner's NRI index %q is not two digits", idx)
	}
	if n >= 99 {
		return "", errNoIndexLeft
	}
	return fmt.Sprintf("%02d", n+1), nil
}

// notReady says why this instance cannot take the node over yet ("" when it can): with NRI it
// must be registered and synchronized with the runtime, so that the runtime calls it for every
// container from the moment it owns the node — unless neither the owner nor this instance
// reaches NRI.
func (p *Plugin) notReady(w handover.Welcome) string {
	if p.nri == nil || p.nri.supervisor.Synced() {
		return ""
	}
	if w.NRIConnected {
		return "not yet registered and synchronized with the NRI runtime"
	}
	select {
	case <-p.nri.supervisor.FirstAttemptDone():
		return ""
	default:
		return "first NRI connection attempt pending"
	}
}

func (p *Plugin) setObserving(sequential bool, why string) {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	p.state.sequential, p.state.waiting = sequential, why
}

// readiness is the "owner" readiness check (contract §11, §14): ready while this instance owns
// the node, or while it waits for an owner that speaks no handover protocol (a rolling update
// must replace that one for this instance to get the node). An observer that can take over is
// not ready until it has: its predecessor is deleted only then.
func (p *Plugin) readiness(context.Context) error {
	if p.Owner() {
		return nil
	}
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	switch {
	case p.state.sequential:
		return nil
	case p.state.retired:
		return errors.New("this instance handed the node over")
	case p.state.waiting != "":
		return errors.New("observing the node's owner: " + p.state.waiting)
	}
	return errors.New("observing the node's owner")
}

// Ownership is where this instance stands (contract §14): for logs, tests and the readiness
// check's reasons.
type Ownership struct {
	// Owner: it owns the node.
	Owner bool
	// Retired: it handed the node over; it takes it back only if the owner goes.
	Retired bool
	// Sequential: the owner speaks no handover protocol; it takes the node when the owner exits.
	Sequential bool
	// Waiting says why an observer has not taken over yet.
	Waiting string
	// NRIIndex is its NRI plugin index ("" before it registers, or without NRI).
	NRIIndex string
}

// Ownership reports where this instance stands.
func (p *Plugin) Ownership() Ownership {
	o := Ownership{Owner: p.Owner()}
	if p.nri != nil && p.nri.started() {
		o.NRIIndex = p.nri.supervisor.PluginIndex()
	}
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	o.Retired, o.Sequential, o.Waiting = p.state.retired, p.state.sequential, p.state.waiting
	return o
}

// waitHandover waits, at most d, for a handover in progress to end.
func (p *Plugin) waitHandover(d time.Duration) {
	for end := time.Now().Add(d); p.inHandover.Load() > 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
}

// nriOwnership answers NRI's question for every vGPU CreateContainer (contract §14).
type nriOwnership struct{ p *Plugin }

func (o nriOwnership) Enter(ctx context.Context) (bool, func(), error) {
	p := o.p
	hctx, cancel := undecidedContext(ctx)
	defer cancel()
	d, done, err := p.nriGate.Enter(hctx)
	if err != nil {
		return false, done, err
	}
	if d == handover.Local {
		return true, done, nil
	}
	// Another instance owns the node — or did: the runtime calls the owner before this instance,
	// and an owner that died under that call left the container undecided. Take the node now if
	// the lock is free, and decide it here.
	if p.tryOwn() {
		if d, done, err := p.nriGate.Enter(hctx); err == nil && d == handover.Local {
			return true, done, nil
		}
	}
	return false, func() {}, nil
}

func (o nriOwnership) Owns() bool { return !o.p.nriGate.Observing() }

// undecidedContext ends undecidedMargin before ctx's deadline (the runtime's request timeout),
// or 1.7 s from now without one.
func undecidedContext(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(2 * time.Second)
	}
	return context.WithDeadline(ctx, deadline.Add(-undecidedMargin))
}

// nriDecisions are the owner's marks (contract §14, "Exactly once"), kept only while they can
// matter: a successor is registered with NRI (this owner marks), this instance observes (it is
// called after the owner and removes the owner's mark), or it took the node over moments ago
// (its predecessor's last marks).
type nriDecisions struct{ p *Plugin }

func (d nriDecisions) marksMayExist() bool {
	p := d.p
	if p.markers == nil {
		return false
	}
	if !p.Owner() {
		return true
	}
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	return p.state.peer || time.Since(p.state.tookAt) < marksLinger
}

func (d nriDecisions) Taken(id string) bool {
	return d.marksMayExist() && d.p.markers.Consume(id)
}

func (d nriDecisions) Record(id string) {
	p := d.p
	if p.markers == nil {
		return
	}
	p.stateMu.Lock()
	peer := p.state.peer
	p.stateMu.Unlock()
	if !peer {
		return
	}
	if err := p.markers.Mark(id); err != nil {
		p.logger.Error(err, "Marking a CreateContainer decided failed; the successor may decide it again (containerd then fails the container and the kubelet retries)")
	}
}

func (d nriDecisions) Forget(id string) {
	if d.marksMayExist() {
		d.p.markers.Consume(id)
	}
}
