package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/health"
	"github.com/vgpu-dra/vgpu-dra/pkg/instancelock"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
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
}

// Plugin is a running kubelet plugin: the parts Start built, in the order it built them.
type Plugin struct {
	cfg    Config
	cancel context.CancelCauseFunc
	done   chan struct{}

	// failed is closed, with failErr set first, when a part fails for good (fail).
	failed   chan struct{}
	failOnce sync.Once
	failErr  error

	metrics *metrics.Metrics
	health  *health.Server

	lock     *instancelock.Lock
	gpus     gpu.Source
	ownsGPUs bool
	store    *checkpoint.Store
	nri      *nriSide // nil when NRI is off
	driver   *driver.Driver
	registry *registry.Server
	helper   *kubeletplugin.Helper

	healthAddr  net.Addr
	metricsAddr net.Addr
}

// Start brings the plugin up, one part after the other, each built from the ones before it:
//
//  1. the instance lock (one plugin per node; a second instance waits here);
//  2. the GPU inventory;
//  3. the checkpoint, loaded before anything is served;
//  4. the NRI side, built but not connected (it decides the path of new claims);
//  5. the driver, which first brings the disk in line with the checkpoint (recovery);
//  6. NRI connects: containers can be created from here on;
//  7. the registry (RETRY until NRI's first Synchronize);
//  8. the kubelet's gRPC services: plugin registration and DRA;
//  9. ResourceSlice publishing and GPU health events;
//  10. health and metrics endpoints.
//
// It returns once the plugin serves; Stop (or ctx) ends it. A failure at any step stops what
// the earlier steps started and releases the lock.
func Start(ctx context.Context, cfg Config, deps Deps) (_ *Plugin, finalErr error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.KubeClient == nil {
		return nil, errors.New("plugin: no Kubernetes client")
	}
	logger := klog.FromContext(ctx)
	// The parts live until Stop, not until ctx ends: a SIGTERM cancels ctx at once, and Stop
	// then takes them down in an order that lets no container through unadjusted (NRI drains
	// first). ctx still bounds the wait for the instance lock.
	waitCtx := ctx
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	p := &Plugin{
		cfg: cfg, cancel: cancel, done: make(chan struct{}), failed: make(chan struct{}),
		metrics: metrics.New(component.NewMetricsRegistry()), health: health.NewServer(),
	}
	context.AfterFunc(ctx, func() { close(p.done) })
	defer func() {
		if finalErr != nil {
			p.Stop()
		}
	}()
	layout := cfg.Layout()
	var err error

	if p.lock, err = instancelock.Acquire(waitCtx, cfg.InstanceLockPath()); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("create state dir %s: %w", cfg.StateDir, err)
	}
	if p.gpus, p.ownsGPUs, err = openGPUs(cfg, deps.GPUs); err != nil {
		return nil, err
	}
	devices, err := p.gpus.Devices(ctx)
	if err != nil {
		return nil, fmt.Errorf("list GPUs: %w", err)
	}
	logger.Info("GPU inventory", "source", cfg.DeviceSource, "gpus", len(devices))
	if p.store, err = checkpoint.Open(cfg.CheckpointPath()); err != nil {
		return nil, err
	}
	quarantine := driver.NewQuarantine(func(n int) { p.metrics.QuarantinedClaims.Set(float64(n)) })
	claims := newCheckpointClaims(p.store, deps.KubeClient, quarantine, logger.WithName("claims"))
	if cfg.NRI {
		p.nri = newNRISide(cfg, layout, claims, p.metrics)
	}
	bootID := deps.BootID
	if bootID == "" {
		bootID = readBootID()
	}
	if p.driver, err = newDriver(ctx, cfg, layout, driverParts{
		devices: devices, store: p.store, metrics: p.metrics, paths: p.claimPaths(), quarantine: quarantine,
		simulated: isSimulated(p.gpus), bootID: bootID, onFatal: p.fail,
		claims: newKubeClaims(cmp.Or(deps.BackgroundClient, deps.KubeClient), cfg.NodeName), atStep: deps.AtStep,
	}); err != nil {
		return nil, err
	}
	if err := p.driver.Recover(ctx); err != nil {
		return nil, fmt.Errorf("recover prepared claims from %s: %w", cfg.CheckpointPath(), err)
	}
	if p.nri != nil {
		if err := p.nri.start(ctx, cfg.DebugSocketPath(), p.health); err != nil {
			return nil, err
		}
	}
	if p.registry, err = startRegistry(ctx, layout, registryTargets(p.nri, claims, layout), p.metrics); err != nil {
		return nil, err
	}
	p.health.Add("registry-socket", p.registry.Check)
	if p.helper, err = startKubeletServices(ctx, cfg, p.driver, deps.KubeClient, deps.DRAListen, p.health); err != nil {
		return nil, err
	}
	p.driver.Start(ctx, p.helper, p.healthEvents(ctx))
	if err := serveSimulatedControl(ctx, cfg.SimulatedControlSocketPath(), p.gpus); err != nil {
		return nil, err
	}
	// In the background: at start-up the API server may not answer yet, and nothing waits for
	// the pass (contract §7, "Reconciliation with the API server").
	go p.driver.RunReconcile(ctx, cfg.ReconcileInterval)
	if p.healthAddr, err = p.health.Serve(ctx, cfg.HealthAddress); err != nil {
		return nil, err
	}
	if p.metricsAddr, err = component.ServeMetrics(ctx, cfg.MetricsAddress, p.metrics.Registry); err != nil {
		return nil, err
	}
	logger.Info("Kubelet plugin started", "driver", cfg.DriverName, "node", cfg.NodeName, "vgpu", cfg.VGPU, "nri", cfg.NRI)
	return p, nil
}

// openGPUs returns the GPU source: the one given, or the one --device-source names (which the
// plugin then owns and closes).
func openGPUs(cfg Config, given gpu.Source) (gpu.Source, bool, error) {
	if given != nil {
		return given, false, nil
	}
	src, err := gpu.ParseSource(cfg.DeviceSource)
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

// claimPaths decides the path of newly prepared claims: NRI's supervisor when NRI is on
// (contract §3), else always per-claim.
func (p *Plugin) claimPaths() driver.PathSelector {
	if p.nri == nil {
		return driver.StaticPath(perClaimPath)
	}
	return p.nri.supervisor
}

// healthEvents starts the GPU health watch when DeviceHealthCheck is on; nil otherwise.
func (p *Plugin) healthEvents(ctx context.Context) <-chan gpu.HealthEvent {
	if !p.cfg.HealthCheck {
		return nil
	}
	events := make(chan gpu.HealthEvent, 16)
	src := p.gpus // Stop clears p.gpus
	go func() {
		if err := src.WatchHealth(ctx, events); err != nil {
			klog.FromContext(ctx).Error(err, "GPU health watch ended")
		}
	}()
	return events
}

// DefaultNRIDrainTimeout bounds how long Stop waits for NRI requests in flight: containerd's
// plugin request timeout is 2 s by default, after which the runtime has given up on them anyway.
const DefaultNRIDrainTimeout = 2500 * time.Millisecond

// Stop takes the plugin down and releases the instance lock; safe to call twice, and on a
// plugin that Start left half-built. The order matters (contract §4, "When the plugin does not
// answer"): first NRI drains — new vGPU containers fail, the requests in flight are answered,
// then the connection closes — so that no container is created without its adjustment; then
// the kubelet's services and the registry stop.
func (p *Plugin) Stop() {
	if p.nri != nil {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultNRIDrainTimeout)
		_ = p.nri.supervisor.Drain(ctx)
		cancel()
	}
	p.cancel(errors.New("plugin stopping"))
	if p.helper != nil {
		p.helper.Stop()
		p.helper = nil
	}
	if p.registry != nil {
		p.registry.Stop()
		p.registry = nil
	}
	if p.driver != nil {
		// The kubelet can no longer call: finish the directory removals of the last Unprepares
		// (what is left after the wait, start-up removes).
		ctx, cancel := context.WithTimeout(context.Background(), DefaultNRIDrainTimeout)
		if err := p.driver.WaitRemovals(ctx); err != nil {
			klog.Background().Error(err, "Claim directories are left to remove; the next start removes them")
		}
		cancel()
	}
	if p.store != nil {
		// Write the removals of the last Unprepares.
		if err := p.store.Close(); err != nil {
			klog.Background().Error(err, "Writing the checkpoint at stop failed; start-up reconciles the claims it still lists")
		}
		p.store = nil
	}
	if p.ownsGPUs && p.gpus != nil {
		_ = p.gpus.Close()
		p.gpus = nil
	}
	if p.lock != nil {
		_ = p.lock.Release()
		p.lock = nil
	}
}

// Settle returns once what Unprepare leaves to the background is done: the claim directories
// removed and the checkpoint's removals written (contract §7: within a second, or at Stop).
// Tests look at the disk after it.
func (p *Plugin) Settle(ctx context.Context) error {
	if p.driver != nil {
		if err := p.driver.WaitRemovals(ctx); err != nil {
			return fmt.Errorf("wait for the removal of unprepared claims' directories: %w", err)
		}
	}
	if p.store == nil {
		return nil
	}
	return p.store.Flush()
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

// Metrics exposes the metrics (tests).
func (p *Plugin) Metrics() *metrics.Metrics { return p.metrics }

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
