package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/arbiter"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/handover"
	"github.com/vgpu-dra/vgpu-dra/pkg/instancelock"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// ownerTerm is what this instance runs while it owns the node (contract §14), from becomeOwner
// to the handover (fence, release) or Stop.
type ownerTerm struct {
	lock     *instancelock.Lock
	store    *checkpoint.Store
	claims   checkpointClaims
	driver   *driver.Driver
	registry *registry.Server
	// cgroups is the node's cgroup hierarchy, found once per term for the reconciliation's
	// view of claim users and the enforcer; nil when it was not found.
	cgroups   *registry.CgroupHierarchy
	publisher *slicePublisher
	// arbiter is the enforcer's compute arbiter once it runs (nil without enforcement): the
	// usage metrics read its allowances from another goroutine.
	arbiter  atomic.Pointer[arbiter.Arbiter]
	handover *handover.Server
	// ctx ends at release or stop: ResourceSlice publishing, GPU health events, the debug and
	// simulated-GPU sockets, the reconciliation.
	ctx    context.Context
	cancel context.CancelFunc
	// reconcile runs under its own context: the fence stops it and Unfence starts it again.
	reconcileCancel context.CancelFunc
	reconcileDone   chan struct{}
	reconcileHalted bool
	interval        time.Duration
	// sockets stop the debug and simulated-GPU endpoints at once (their paths are free when
	// they return): at a handover they must be gone before the lock is released.
	sockets []func()
	// fencedAt is when the fence closed the gates (the start of the handover's pause);
	// heldBefore the gates' held-call count then.
	fencedAt   time.Time
	heldBefore int64
}

// becomeOwner takes the node with lock held: it opens the checkpoint and brings up everything
// only the owner runs, in the order of architecture.md's "Start-up order", then lets the calls
// through. On failure it stops what it started and releases the lock. Call it with roleMu held.
func (p *Plugin) becomeOwner(lock *instancelock.Lock, nriIndex, event string) (finalErr error) {
	cfg, logger := p.cfg, p.logger
	p.step("acquired")
	ctx, cancel := context.WithCancel(p.ctx)
	t := &ownerTerm{lock: lock, ctx: ctx, cancel: cancel, interval: cfg.ReconcileInterval}
	defer func() {
		if finalErr != nil {
			p.delegate.set(nil, nil)
			t.stop()
		}
	}()
	layout := cfg.Layout()
	var err error
	if t.store, err = checkpoint.Open(cfg.CheckpointPath()); err != nil {
		return err
	}
	quarantine := driver.NewQuarantine(func(n int) { p.metrics.QuarantinedClaims.Set(float64(n)) })
	t.claims = newCheckpointClaims(t.store, p.deps.KubeClient, quarantine, logger.WithName("claims"))
	bootID := p.deps.BootID
	if bootID == "" {
		bootID = readBootID()
	}
	if h, err := registry.DetectCgroupHierarchy("/proc"); err == nil {
		t.cgroups = &h
	} else {
		logger.Error(err, "No cgroup hierarchy: the enforcer does not run, and the reconciliation cannot tell which per-claim claims still have containers, nor stop any")
	}
	events := p.pluginEvents(ctx)
	if t.driver, err = newDriver(ctx, cfg, layout, driverParts{
		devices: p.devices, store: t.store, metrics: p.metrics, dra: p.dra, paths: p.claimPaths(), quarantine: quarantine,
		simulated: isSimulated(p.gpus), bootID: bootID, onFatal: p.fail,
		claims: newKubeClaims(cmp.Or(p.deps.BackgroundClient, p.deps.KubeClient), cfg.NodeName), atStep: p.deps.AtStep,
		users: p.claimUsers(layout, t.cgroups, events), events: events,
		migLayouts: p.migLayouts, mig: p.mig,
	}); err != nil {
		return err
	}
	if err := t.driver.Recover(ctx); err != nil {
		return fmt.Errorf("recover prepared claims from %s: %w", cfg.CheckpointPath(), err)
	}
	if p.nri != nil {
		// The cache is the node's from here on: rebuilt from what the runtime told this
		// instance while it observed (empty for an instance that just started).
		p.nri.plugin.Own(t.claims)
		p.nri.start(p.ctx, nriIndex, p.health)
		stop, err := p.nri.serveDebug(ctx, cfg.DebugSocketPath())
		if err != nil {
			return err
		}
		t.sockets = append(t.sockets, stop)
	}
	// The registry outlives the term's context: at a handover it answers until the new owner's
	// socket is in place, then yields (handoverOwner.Took).
	if t.registry, err = startRegistry(p.ctx, layout, registryTargets(p.nri, t.claims, layout), p.regm); err != nil {
		return err
	}
	p.delegate.set(t.driver, ctx)
	if p.helper == nil {
		if p.helper, err = p.startKubeletServices(); err != nil {
			return err
		}
	}
	t.publisher = newSlicePublisher(ctx, cfg, p.deps.KubeClient, t.driver.HandleError)
	t.driver.StartPublishing(ctx, t.publisher, p.healthEvents(ctx))
	// Status writes outlive the term: the claims this instance prepared get their status even
	// when it hands the node over a millisecond later.
	t.driver.StartStatusWriter(p.ctx)
	stopControl, err := serveSimulatedControl(ctx, cfg.SimulatedControlSocketPath(), p.gpus)
	if err != nil {
		return err
	}
	t.sockets = append(t.sockets, stopControl)
	// In the background: at start-up the API server may not answer yet, and nothing waits for
	// the pass (contract §7, "Reconciliation with the API server").
	t.startReconcile()
	if cfg.HandoverEnabled() {
		if t.handover, err = handover.Listen(ctx, cfg.HandoverSocketPath(), handoverOwner{p}, handover.Timeouts{}); err != nil {
			return err
		}
		lock.SetRecord(handover.Record{Handover: handover.Version, PodUID: cfg.PodUID, NRIIndex: p.nriIndex()}.String())
	}
	p.term.Store(t)
	p.draGate.Own()
	p.nriGate.Own()
	// The wall (contract §15): the owner's enforcer, with the registry's record of who
	// registered. Started once the node is this instance's, not between the NRI cache's rebuild
	// (Own) and the ownership flip, a window kept as short as it can be.
	p.startEnforcer(ctx, t, p.em)
	p.hm.Owner.Set(1)
	p.hm.Events.WithLabelValues(event).Inc()
	p.state.waiting = ""
	if event != "started" {
		logger.Info("This instance owns the node", "how", event, "nriIndex", p.nriIndex())
	}
	return nil
}

// nriIndex is the NRI plugin index in use ("" without NRI).
func (p *Plugin) nriIndex() string {
	if p.nri == nil {
		return ""
	}
	return p.nri.supervisor.PluginIndex()
}

// claimPaths decides the path of newly prepared claims: NRI's supervisor when NRI is on
// (contract §3), else always per-claim.
func (p *Plugin) claimPaths() driver.PathSelector {
	if p.nri == nil {
		return driver.StaticPath(perClaimPath)
	}
	return p.nri.supervisor
}

func (t *ownerTerm) startReconcile() {
	ctx, cancel := context.WithCancel(t.ctx)
	done := make(chan struct{})
	t.reconcileCancel, t.reconcileDone, t.reconcileHalted = cancel, done, false
	go func() {
		defer close(done)
		t.driver.RunReconcile(ctx, t.interval)
	}()
}

// reconcileStopped reports whether the fence stopped the reconciliation.
func (t *ownerTerm) reconcileStopped() bool { return t.reconcileHalted }

// stopReconcile ends the reconciliation and waits for it (a pass in the middle of an unprepare
// finishes it), at most until ctx ends.
func (t *ownerTerm) stopReconcile(ctx context.Context) error {
	if t.reconcileCancel == nil {
		return nil
	}
	t.reconcileHalted = true
	t.reconcileCancel()
	select {
	case <-t.reconcileDone:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the reconciliation with the API server did not stop: %w", context.Cause(ctx))
	}
}

// settle returns once the claim directories Unprepare left to the background are removed and
// the checkpoint's deferred removals are written.
func (t *ownerTerm) settle(ctx context.Context) error {
	if t.driver != nil {
		if err := t.driver.WaitRemovals(ctx); err != nil {
			return fmt.Errorf("wait for the removal of unprepared claims' directories: %w", err)
		}
	}
	if t.store == nil {
		return nil
	}
	return t.store.Flush()
}

// stop ends the term for good (Stop, or a failed becomeOwner): every part it started, the
// registry with its socket, and the lock last. The kubelet can no longer call: the directory
// removals of the last Unprepares are finished and their checkpoint removals written before the
// lock goes (what a crash leaves, the next start removes and reconciles).
func (t *ownerTerm) stop() {
	t.stopSockets()
	t.cancel()
	if t.reconcileDone != nil {
		<-t.reconcileDone
	}
	if t.driver != nil {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultNRIDrainTimeout)
		if err := t.driver.WaitRemovals(ctx); err != nil {
			klog.Background().Error(err, "Claim directories are left to remove; the next start removes them")
		}
		cancel()
	}
	if t.store != nil {
		if err := t.store.Close(); err != nil && !errors.Is(err, checkpoint.ErrSealed) {
			klog.Background().Error(err, "Writing the checkpoint at stop failed; start-up reconciles the claims it still lists")
		}
	}
	if t.handover != nil {
		t.handover.Stop()
	}
	if t.publisher != nil {
		t.publisher.Stop()
	}
	if t.registry != nil {
		t.registry.Stop()
	}
	_ = t.lock.Release()
}

// stopSockets closes the debug and simulated-GPU endpoints and removes their sockets.
func (t *ownerTerm) stopSockets() {
	for _, stop := range t.sockets {
		stop()
	}
}

// stopRetired ends what a term that was handed over still runs: its registry, which answered
// what it had accepted and left the socket path to the new owner, and the handover session.
func (t *ownerTerm) stopRetired() {
	if t.handover != nil {
		t.handover.Stop()
	}
	if t.registry != nil {
		t.registry.Stop()
	}
}

// step tells the test hook that a handover reached step.
func (p *Plugin) step(step string) {
	if p.deps.HandoverStep != nil {
		p.deps.HandoverStep(step)
	}
}

// ownerOnly wraps a health check of a part only the owner runs: an instance that observes has
// none of them, and must not be restarted for it.
func (p *Plugin) ownerOnly(check func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		if !p.Owner() {
			return nil
		}
		return check(ctx)
	}
}

// addChecks registers the health checks: those of the owner's parts (they pass while this
// instance observes) and readiness, which says whether this instance serves the node or can
// take it over (contract §11, §14).
func (p *Plugin) addChecks() {
	p.health.Add("registry-socket", p.ownerOnly(func(ctx context.Context) error {
		t := p.term.Load()
		if t == nil {
			return nil
		}
		return t.registry.Check(ctx)
	}))
	p.health.AddReadiness("owner", p.readiness)
}

var _ nri.Ownership = nriOwnership{}

// logStep is the logger of handover steps.
func (p *Plugin) logStep() klog.Logger { return p.logger.WithName("handover") }
