package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/handover"
	"github.com/vgpu-dra/vgpu-dra/pkg/health"
	"github.com/vgpu-dra/vgpu-dra/pkg/instancelock"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
)

// Deps are what the node provides; tests replace them with fakes.
type Deps struct {
	// KubeClient talks to the API server. Required: cmd builds it from the shared flags
	// (component.Options.KubeClient), tests pass a fake clientset.
	KubeClient kubernetes.Interface
	// BackgroundClient talks to the API server for what runs off the kubelet's path: claims'
	// device status and the reconciliation. A client of its own has a client-side rate limiter of
	// its own, so that those writes (one per prepared claim) never make a Prepare's claim read
	// wait for a token: sharing one limiter of 50 QPS, a Prepare took 40 ms once the burst was
	// spent (bench-compare). Nil: KubeClient.
	BackgroundClient kubernetes.Interface
	// GPUs is the inventory; opened from Config.DeviceSource when nil.
	GPUs gpu.Source
	// BootID overrides /proc/sys/kernel/random/boot_id (tests simulate reboots with it).
	BootID string
	// DRAListen, when set, creates the listener of the DRA socket instead of the helper
	// (tests break the helper's gRPC server through it).
	DRAListen func(ctx context.Context, path string) (net.Listener, error)
	// AtStep is called at each step of Prepare and Unprepare (driver.Step): the crash tests
	// kill the process there. Nil outside tests.
	AtStep func(driver.Step)
	// MetricsAccess guards /metrics (component.Options.MetricsAccess, --metrics-auth); nil
	// serves it to anyone over plain HTTP.
	MetricsAccess *component.MetricsAccess
	// MetricsRegistry is the registry the plugin's metrics go on; a new one
	// (component.NewMetricsRegistry) when nil. Tests pass one that records what is registered.
	MetricsRegistry k8smetrics.KubeRegistry
	// LoadCheckpoint reads the checkpoint as a successor checks it before it takes the node
	// over; checkpoint.Load when nil (tests make it refuse a format, as an older build would).
	LoadCheckpoint func(path string) (checkpoint.Data, error)
	// HandoverStep, when set, is told each step of a handover this instance takes part in, on
	// the goroutine that takes it, before the step's effect is visible to the other instance
	// (tests kill the process there).
	HandoverStep func(step string)
}

// Plugin is a running kubelet plugin. What it runs for the process's life (GPU inventory, NRI
// connection, the kubelet's gRPC services, probes) is built by Start; what only the owner of the
// node runs (checkpoint, driver, registry, ResourceSlices, ...) is an ownerTerm, built when this
// instance takes the node and stopped when it hands it over (contract §14).
type Plugin struct {
	cfg    Config
	deps   Deps
	ctx    context.Context // the process's parts; ends with Stop
	cancel context.CancelCauseFunc
	done   chan struct{}
	logger klog.Logger

	// failed is closed, with failErr set first, when a part fails for good (fail).
	failed   chan struct{}
	failOnce sync.Once
	failErr  error

	metrics  *metrics.Metrics
	dra      *metrics.DRAMetrics
	regm     *metrics.RegistryMetrics
	hm       *metrics.HandoverMetrics
	em       *metrics.EnforcementMetrics
	health   *health.Server
	gpus     gpu.Source
	ownsGPUs bool
	devices  []gpu.Device
	// migLayouts are the MIG-managed GPUs (--mig-gpus), mig their source's MIG; nil without.
	migLayouts map[string]gpu.MIGLayout
	mig        gpu.MIG
	nri        *nriSide // nil when NRI is off

	// draGate and nriGate hold the kubelet's calls and NRI's vGPU CreateContainers while a
	// handover is decided, and pass them on when another instance owns the node.
	draGate, nriGate *handover.Gate
	markers          *handover.Markers // nil without handover
	delegate         *draDelegate
	forwarder        *forwarder

	// roleMu serialises changes of ownership; term is set while this instance owns the node.
	roleMu     sync.Mutex
	term       atomic.Pointer[ownerTerm]
	helper     *kubeletplugin.Helper // started by the first term, kept for the process's life
	retiredOld []*ownerTerm          // terms handed over: their registries answer what they took
	// inHandover counts the handovers in progress (Stop lets them finish); kubeletCalls the
	// kubelet's Prepare and Unprepare calls in flight (Stop lets them finish too).
	inHandover   atomic.Int32
	kubeletCalls atomic.Int32
	stateMu      sync.Mutex
	state        observerState
	observer     sync.WaitGroup
	kick         chan struct{} // wakes the observer loop (a peer left)
	stopping     atomic.Bool
	usage        *usage.Sampler // nil when usage metrics are off

	healthAddr  net.Addr
	metricsAddr net.Addr
}

// observerState is what an instance that does not own the node knows (under roleMu).
type observerState struct {
	// retired: this instance handed the node over; it never asks for it back (it takes it only
	// when the lock is free: the owner is gone).
	retired bool
	// sequential: the owner speaks no handover protocol; this instance waits for the lock, and
	// is ready meanwhile, so that a rolling update replaces the owner.
	sequential bool
	// why this instance does not own the node yet (readiness says it).
	waiting string
	// peer: a successor announced itself (marks on); tookAt: when this instance last took the
	// node over from another (its predecessor's marks may still be read); expecting: this
	// instance committed to a handover and the owner may release the lock any moment.
	peer      bool
	tookAt    time.Time
	expecting bool
	// predecessors are the pods that handed the node over to this instance: refused as successors.
	predecessors []string
}

// Start brings the plugin up. First what every instance runs, whatever it owns:
//
//  1. the GPU inventory;
//  2. the NRI side, built but not connected (it decides the path of new claims);
//  3. the usage sampler (per-container metrics: what the owner's cache and checkpoint hold),
//     health and metrics endpoints.
//
// Then, when the instance lock is free, it takes the node (becomeOwner, in the order of
// architecture.md's "Start-up order": checkpoint, recovery, NRI connection, registry, kubelet
// services, ResourceSlices). When another instance holds it, this one observes: it asks the owner
// to hand the node over (contract §14) or, when the owner speaks no handover protocol, waits for
// the lock; either happens in the background. A failure at any synchronous step stops what the
// earlier steps started and releases the lock.
func Start(ctx context.Context, cfg Config, deps Deps) (_ *Plugin, finalErr error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.KubeClient == nil {
		return nil, errors.New("plugin: no Kubernetes client")
	}
	if deps.LoadCheckpoint == nil {
		deps.LoadCheckpoint = checkpoint.Load
	}
	logger := klog.FromContext(ctx)
	// The parts live until Stop, not until ctx ends: a SIGTERM cancels ctx at once, and Stop
	// then takes them down in an order that lets no container through unadjusted (NRI drains
	// first).
	pctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	reg := deps.MetricsRegistry
	if reg == nil {
		reg = component.NewMetricsRegistry()
	}
	p := &Plugin{
		cfg: cfg, deps: deps, ctx: pctx, cancel: cancel, done: make(chan struct{}), failed: make(chan struct{}), logger: logger,
		metrics: metrics.New(reg), health: health.NewServer(), kick: make(chan struct{}, 1),
	}
	p.dra, p.regm, p.hm = metrics.NewDRAMetrics(reg), metrics.NewRegistryMetrics(reg), metrics.NewHandoverMetrics(reg)
	p.em = metrics.NewEnforcementMetrics(reg)
	p.draGate = handover.NewGate(func(time.Duration) { p.hm.HeldCalls.WithLabelValues(metrics.CallKubelet).Inc() })
	p.nriGate = handover.NewGate(func(time.Duration) { p.hm.HeldCalls.WithLabelValues(metrics.CallCreateContainer).Inc() })
	p.delegate = &draDelegate{}
	p.forwarder = &forwarder{}
	context.AfterFunc(pctx, func() { close(p.done) })
	defer func() {
		if finalErr != nil {
			p.Stop()
		}
	}()
	var err error

	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("create state dir %s: %w", cfg.StateDir, err)
	}
	if p.gpus, p.ownsGPUs, err = openGPUs(cfg, deps.GPUs); err != nil {
		return nil, err
	}
	if p.devices, err = p.gpus.Devices(pctx); err != nil {
		return nil, fmt.Errorf("list GPUs: %w", err)
	}
	logger.Info("GPU inventory", "source", cfg.DeviceSource, "gpus", len(p.devices))
	if p.migLayouts, p.mig, err = migLayouts(logger, cfg, p.gpus, p.devices); err != nil {
		return nil, err
	}
	checkToolkitConfig(logger, cfg)
	if cfg.HandoverEnabled() {
		if p.markers, err = handover.NewMarkers(cfg.DecisionMarkersDir()); err != nil {
			return nil, err
		}
	}
	if cfg.NRI {
		p.nri = newNRISide(cfg, p.cfg.Layout(), p.metrics)
		p.nri.plugin.SetOwnership(nriOwnership{p}, nriDecisions{p})
	}
	p.addChecks()

	lock, err := instancelock.TryAcquire(cfg.InstanceLockPath())
	switch {
	case err == nil:
		p.roleMu.Lock()
		err = p.becomeOwner(lock, cfg.NRIPluginIndex, metrics.EventStarted)
		p.roleMu.Unlock()
		if err != nil {
			return nil, err
		}
		// A fresh owner: no other instance is registered with NRI, so no mark is waiting for it.
		if p.markers != nil {
			_, _ = p.markers.Sweep(0)
		}
	case errors.Is(err, instancelock.ErrHeld):
		p.observer.Add(1)
		go p.observe()
	default:
		return nil, err
	}
	if cfg.MetricsAddress != "" && cfg.UsageInterval > 0 {
		p.usage = p.startUsage(pctx, cfg.Layout())
	}
	if p.healthAddr, err = p.health.Serve(pctx, cfg.HealthAddress); err != nil {
		return nil, err
	}
	if p.metricsAddr, err = component.ServeMetrics(pctx, cfg.MetricsAddress, p.metrics.Registry, deps.MetricsAccess); err != nil {
		return nil, err
	}
	if p.Owner() {
		logger.Info("Kubelet plugin started", "driver", cfg.DriverName, "node", cfg.NodeName, "vgpu", cfg.VGPU, "nri", cfg.NRI)
	}
	return p, nil
}

// openGPUs returns the GPU source: the one given, or the one --device-source names (which the
// plugin then owns and closes).
func openGPUs(cfg Config, given gpu.Source) (gpu.Source, bool, error) {
	if given != nil {
		return given, false, nil
	}
	src, err := gpu.ParseSource(cfg.DeviceSource, cfg.NodeName)
	if err != nil {
		return nil, false, fmt.Errorf("open GPU source %q: %w", cfg.DeviceSource, err)
	}
	return src, true, nil
}

// isSimulated: simulated GPUs carry made-up PCI addresses that may name a real device of this
// host (0000:00:00.0 is the host bridge), so they get no pcieRoot from sysfs.
func isSimulated(src gpu.Source) bool {
	_, simulated := src.(*gpu.Simulated)
	return simulated
}

// healthEvents starts the GPU health watch when DeviceHealthCheck is on; nil otherwise.
func (p *Plugin) healthEvents(ctx context.Context) <-chan gpu.HealthEvent {
	if !p.cfg.HealthCheck {
		return nil
	}
	events := make(chan gpu.HealthEvent, 16)
	src := p.gpus // Stop clears p.gpus
	go func() {
		if err := src.WatchHealth(ctx, events); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "GPU health watch ended")
		}
	}()
	return events
}

// DefaultNRIDrainTimeout bounds how long Stop waits for NRI requests in flight: containerd's
// plugin request timeout is 2 s by default, after which the runtime has given up on them anyway.
const DefaultNRIDrainTimeout = 2500 * time.Millisecond

// stopHandoverWait bounds how long Stop lets a handover in progress finish.
const stopHandoverWait = 5 * time.Second

// Stop takes the plugin down and releases the instance lock; safe to call twice, and on a
// plugin that Start left half-built. The order matters (contract §4, "When the plugin does not
// answer"): a handover in progress finishes first; then NRI drains — new vGPU containers fail,
// the requests in flight are answered, then the connection closes — so that no container is
// created without its adjustment; then the kubelet's services, the registry and the rest of the
// owner's parts stop.
func (p *Plugin) Stop() {
	p.stopping.Store(true)
	p.waitHandover(stopHandoverWait)
	if p.nri != nil {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultNRIDrainTimeout)
		_ = p.nri.supervisor.Drain(ctx)
		cancel()
	}
	p.cancel(errors.New("plugin stopping"))
	p.observer.Wait()
	if !p.Owner() {
		// An instance that handed the node over forwards what still reaches it; the kubelet
		// sends it nothing new once the new owner is connected. Its calls in flight finish
		// before its sockets go (the kubelet would fail them when the socket went).
		p.waitKubeletCalls()
	}
	p.roleMu.Lock()
	defer p.roleMu.Unlock()
	if p.helper != nil {
		p.helper.Stop()
		p.helper = nil
	}
	p.forwarder.close()
	if t := p.term.Swap(nil); t != nil {
		t.stop()
	}
	for _, t := range p.retiredOld {
		t.stopRetired()
	}
	p.retiredOld = nil
	if p.ownsGPUs && p.gpus != nil {
		_ = p.gpus.Close()
		p.gpus = nil
	}
}

// Settle returns once what Unprepare leaves to the background is done: the claim directories
// removed and the checkpoint's removals written (contract §7: within a second, or at Stop).
// Tests look at the disk after it. An instance that does not own the node has nothing to settle.
func (p *Plugin) Settle(ctx context.Context) error {
	t := p.term.Load()
	if t == nil {
		return nil
	}
	return t.settle(ctx)
}

// Done is closed when the plugin's context ends.
func (p *Plugin) Done() <-chan struct{} { return p.done }

// fail records that a part of the plugin failed for good and closes Failed. The plugin is not
// stopped here: the caller stops it (Stop drains NRI first) and exits, and the DaemonSet
// restarts it.
func (p *Plugin) fail(err error) {
	p.failOnce.Do(func() {
		p.failErr = err
		close(p.failed)
	})
}

// Failed is closed when a part of the plugin has failed for good (the DRA helper's gRPC
// servers): the caller must Stop the plugin and exit with Err, so that it is restarted.
func (p *Plugin) Failed() <-chan struct{} { return p.failed }

// Err is why Failed was closed; nil while it is not.
func (p *Plugin) Err() error {
	select {
	case <-p.failed:
		return p.failErr
	default:
		return nil
	}
}

// Owner reports whether this instance owns the node now.
func (p *Plugin) Owner() bool { return p.term.Load() != nil }

// Metrics exposes the metrics (tests).
func (p *Plugin) Metrics() *metrics.Metrics { return p.metrics }

// Usage is the per-container usage sampler; nil when usage metrics are off.
func (p *Plugin) Usage() *usage.Sampler { return p.usage }

// HealthAddr is the bound health address, nil when disabled.
func (p *Plugin) HealthAddr() net.Addr { return p.healthAddr }

// MetricsAddr is the bound metrics address, nil when disabled.
func (p *Plugin) MetricsAddr() net.Addr { return p.metricsAddr }

func readBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
