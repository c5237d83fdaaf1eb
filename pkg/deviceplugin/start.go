package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/kubernetes"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/health"
	"github.com/vgpu-dra/vgpu-dra/pkg/instancelock"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// startupKeepTimeout bounds the first reconciliation of the share directories at start-up
// (after a reboot it rebuilds the sets the kubelet's containers hold, before the CDI spec lets
// them be created).
const startupKeepTimeout = 5 * time.Second

// Deps are what the node provides; tests replace them with fakes.
type Deps struct {
	// KubeClient reads pods (whose UID holds a share) and labels the node. Required.
	KubeClient kubernetes.Interface
	// GPUs is the inventory; opened from Config.DeviceSource when nil.
	GPUs gpu.Source
	// PodResources is the kubelet's pod-resources API; the socket of Config when nil.
	PodResources PodResources
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// MetricsAccess guards /metrics (component.Options.MetricsAccess, --metrics-auth); nil
	// serves it to anyone over plain HTTP.
	MetricsAccess *component.MetricsAccess
}

// Plugin is a running device plugin: the parts Start built, in the order it built them.
type Plugin struct {
	cfg    Config
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup

	metrics *metrics.DevicePluginMetrics
	health  *health.Server

	lock     *instancelock.Lock
	gpus     gpu.Source
	ownsGPUs bool
	inv      *Inventory
	cdi      *cdi.Writer
	devices  *devices
	alloc    *allocator
	podRes   *grpc.ClientConn
	cgroups  registry.CgroupHierarchy
	regSrv   *registry.Server
	endpoint *endpoint
}

// Start brings the device plugin up, each part from the ones before it:
//
//  1. the instance lock — the kubelet plugin's own, so the two never run on one node;
//  2. the GPU inventory, cut into shares;
//  3. libvgpu.so installed into the state dir, and the CDI writer;
//  4. the share directories brought in line with what the kubelet says is held (after a
//     reboot: rebuilt), then the shares' CDI spec;
//  5. the registry, which checks a caller's pod against the kubelet's record of the share;
//  6. the device-plugin server: listen, serve, then register, and keep registered;
//  7. GPU health events, the node's labels, the keeper of the share directories;
//  8. the node-side enforcer over the containers that hold shares (--enforce);
//  9. debug, health and metrics endpoints.
//
// It returns once the plugin serves; Stop (or ctx) ends it. A failure at any step stops what
// the earlier steps started and releases the lock.
func Start(ctx context.Context, cfg Config, deps Deps) (_ *Plugin, finalErr error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.KubeClient == nil {
		return nil, errors.New("device plugin: no Kubernetes client")
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	logger := klog.FromContext(ctx)
	waitCtx := ctx
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	reg := component.NewMetricsRegistry()
	p := &Plugin{cfg: cfg, cancel: cancel, metrics: metrics.NewDevicePluginMetrics(reg), health: health.NewServer()}
	context.AfterFunc(waitCtx, func() { cancel(context.Cause(waitCtx)) })
	defer func() {
		if finalErr != nil {
			p.Stop()
		}
	}()
	var err error
	if p.lock, err = instancelock.Acquire(waitCtx, cfg.InstanceLockPath()); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("create state dir %s: %w", cfg.StateDir, err)
	}
	if err := p.openInventory(ctx, deps.GPUs); err != nil {
		return nil, err
	}
	if p.cdi, err = newCDIWriter(cfg, logger); err != nil {
		return nil, err
	}
	p.devices = newDevices(p.inv)
	p.alloc = newAllocator(p.inv, cfg.Layout(), p.cdi, p.devices.gpuHealthy, deps.Now)
	kubelet := deps.PodResources
	if kubelet == nil {
		// Lazy: it connects on the first call and again after the kubelet restarts.
		if p.podRes, err = grpc.NewClient("unix://"+cfg.PodResourcesSocket(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return nil, fmt.Errorf("pod-resources client: %w", err)
		}
		kubelet = podresourcesapi.NewPodResourcesListerClient(p.podRes)
	}
	holders := &holders{kubelet: kubelet, kube: deps.KubeClient, resource: cfg.ResourceName}
	p.alloc.onAllocate = holders.answers.forget
	keep := &keeper{alloc: p.alloc, holders: holders, grace: cfg.keepGrace(), interval: cfg.keepInterval(), started: deps.Now(), logger: logger.WithName("share-dirs")}
	if h, err := registry.DetectCgroupHierarchy("/proc"); err == nil {
		keep.inUse = func(configDir string) bool {
			return len(registry.ListedContainers(h, configDir, func(string) bool { return true })) > 0
		}
	}
	keepCtx, keepCancel := context.WithTimeout(ctx, startupKeepTimeout)
	if err := keep.pass(keepCtx); err != nil {
		logger.Error(err, "Share directories not reconciled at start-up; the keeper retries")
	}
	keepCancel()
	if err := p.cdi.WriteShares(p.cdiShares()); err != nil {
		return nil, err
	}
	if err := p.startRegistry(ctx, holders, reg); err != nil {
		return nil, err
	}
	if err := p.startEndpoint(ctx, logger); err != nil {
		return nil, err
	}
	p.startBackground(ctx, keep, deps.KubeClient, logger)
	p.startEnforcer(ctx, holders, deps.KubeClient, reg, logger)
	if path := cfg.DebugSocketPath(); path != "" {
		if err := p.serveDebug(ctx, path, logger.WithName("debug")); err != nil {
			return nil, err
		}
	}
	if _, err = p.health.Serve(ctx, cfg.HealthAddress); err != nil {
		return nil, err
	}
	if _, err = component.ServeMetrics(ctx, cfg.MetricsAddress, reg, deps.MetricsAccess); err != nil {
		return nil, err
	}
	logger.Info("Device plugin started", "resource", cfg.ResourceName, "node", cfg.NodeName, "gpus", len(p.inv.GPUs), "shares", len(p.inv.Shares), "policy", cfg.Policy)
	return p, nil
}

// openInventory opens the GPU source (the given one, or --device-source's, which the plugin
// then owns) and cuts its GPUs into shares.
func (p *Plugin) openInventory(ctx context.Context, given gpu.Source) error {
	p.gpus = given
	if given == nil {
		src, err := gpu.ParseSource(p.cfg.DeviceSource, p.cfg.NodeName)
		if err != nil {
			return fmt.Errorf("open GPU source %q: %w", p.cfg.DeviceSource, err)
		}
		p.gpus, p.ownsGPUs = src, true
	}
	devs, err := p.gpus.Devices(ctx)
	if err != nil {
		return fmt.Errorf("list GPUs: %w", err)
	}
	if p.inv, err = NewInventory(devs, p.cfg.Sizing, p.cfg.ResourceName); err != nil {
		return fmt.Errorf("cut the GPUs into shares: %w", err)
	}
	return nil
}

// newCDIWriter installs libvgpu.so into the state dir and builds the CDI writer.
func newCDIWriter(cfg Config, logger klog.Logger) (*cdi.Writer, error) {
	layout := cfg.Layout()
	lib, err := layout.InstallLibrary(cfg.LibrarySource)
	if err != nil {
		return nil, err
	}
	switch {
	case lib.SourceMissing:
		logger.Info("No libvgpu.so to install", "source", cfg.LibrarySource)
	case lib.Bytes > 0:
		logger.Info("Installed libvgpu.so", "source", cfg.LibrarySource, "path", layout.LibraryPath(), "bytes", lib.Bytes)
	}
	if !lib.Installed {
		logger.Info("libvgpu.so is not installed in the state dir: containers get limits in their env, nothing in them enforces those, and the node's enforcer holds them to their memory only", "library", layout.LibraryPath())
	}
	return cdi.NewWriter(cdi.Options{
		DriverName: cfg.DriverName, SpecDir: cfg.CDIDir,
		RegistryDir: layout.RegistryDir(), LibraryPath: layout.LibraryPath(), PreloadPath: layout.PreloadPath(),
		LibraryInstalled: lib.Installed, VGPU: true,
		GPUInjection: cfg.GPUInjection, GPUCDIKind: cfg.GPUCDIKind,
	})
}

// cdiShares are the shares with their directory sets, for the CDI spec.
func (p *Plugin) cdiShares() []cdi.Share {
	layout := p.cfg.Layout()
	out := make([]cdi.Share, 0, len(p.inv.Shares))
	for _, sh := range p.inv.Shares {
		d, err := layout.PerClaimDirs(sh.UID)
		if err != nil { // a derived UID is always valid; nothing to skip in practice
			continue
		}
		out = append(out, cdi.Share{ID: sh.ID, Dirs: cdi.PerClaimDirs{Config: d.Config, VGPULock: d.VGPULock, VMemNode: d.VMemNode}})
	}
	return out
}

// startRegistry serves the registry socket (contract §5) over the shares, checking callers in
// the cgroup hierarchy that the enforcer then reads processes in.
func (p *Plugin) startRegistry(ctx context.Context, h *holders, reg k8smetrics.KubeRegistry) error {
	cgroups, err := registry.DetectCgroupHierarchy("/proc")
	if err != nil {
		return fmt.Errorf("find the cgroup hierarchy for registry peer checks: %w", err)
	}
	p.cgroups = cgroups
	layout := p.cfg.Layout()
	p.regSrv, err = registry.Start(ctx, registry.Config{Socket: layout.RegistrySocket()}, registry.Deps{
		Claims:  shareTargets{inv: p.inv, layout: layout, holders: h},
		Cgroups: &cgroups,
		Metrics: metrics.NewRegistryMetrics(reg),
	})
	if err != nil {
		return err
	}
	p.health.Add("registry-socket", p.regSrv.Check)
	return nil
}

// startEndpoint serves the DevicePlugin service and registers it with the kubelet.
func (p *Plugin) startEndpoint(ctx context.Context, logger klog.Logger) error {
	svc := &service{inv: p.inv, devices: p.devices, alloc: p.alloc, policy: p.cfg.Policy, metrics: p.metrics,
		logger: logger.WithName("device-plugin"), now: p.alloc.now}
	p.endpoint = &endpoint{
		socket: p.cfg.Socket(), kubeletSocket: p.cfg.KubeletSocket(), resourceName: p.cfg.ResourceName,
		services:     func(s *grpc.Server) { pluginapi.RegisterDevicePluginServer(s, svc) },
		timings:      defaultEndpointTimings,
		logger:       logger.WithName("registration"),
		onRegistered: p.metrics.Registrations.Inc,
	}
	svc.streams = &p.endpoint.streams
	if err := p.endpoint.start(ctx); err != nil {
		return err
	}
	p.health.Add("kubelet-registration", p.endpoint.check)
	p.health.Add("device-plugin-socket", socketCheck(p.cfg.Socket()))
	return nil
}

// startBackground follows GPU health, publishes the node's labels and keeps the share
// directories, until ctx ends.
func (p *Plugin) startBackground(ctx context.Context, keep *keeper, kube kubernetes.Interface, logger klog.Logger) {
	p.updateShareGauge()
	if p.cfg.HealthCheck {
		events := make(chan gpu.HealthEvent, 16)
		src := p.gpus
		p.wg.Go(func() {
			if err := src.WatchHealth(ctx, events); err != nil {
				logger.Error(err, "GPU health watch ended")
			}
		})
		p.wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case ev := <-events:
					if p.devices.apply(ev) {
						logger.Info("GPU health changed", "uuid", ev.UUID, "healthy", ev.Healthy, "reason", ev.Reason)
						p.updateShareGauge()
					}
				}
			}
		})
	}
	labels, annotations, err := nodeMetadata(p.inv, p.cfg.ResourceName)
	if err != nil {
		logger.Error(err, "Node labels not published")
	} else {
		p.wg.Go(func() { publishLabels(ctx, kube, p.cfg.NodeName, labels, annotations, logger.WithName("labels")) })
	}
	p.wg.Go(func() { keep.run(ctx) })
}

func (p *Plugin) updateShareGauge() {
	healthy, unhealthy := p.devices.counts()
	p.metrics.Shares.WithLabelValues("healthy").Set(float64(healthy))
	p.metrics.Shares.WithLabelValues("unhealthy").Set(float64(unhealthy))
}

// socketCheck is the liveness check "device-plugin-socket": GetDevicePluginOptions answers on
// the plugin's socket, through the server the kubelet uses.
func socketCheck(socket string) health.Check {
	return func(ctx context.Context) error {
		conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("dial the plugin socket %s: %w", socket, err)
		}
		defer conn.Close()
		if _, err := pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
			return fmt.Errorf("the plugin socket %s does not answer: %w", socket, err)
		}
		return nil
	}
}

// Stop takes the plugin down and releases the instance lock; safe to call twice and on a
// plugin Start left half-built. The socket goes first (the kubelet sees the plugin gone), the
// registry last but one, the GPU source after every health watch has returned.
func (p *Plugin) Stop() {
	p.cancel(errors.New("device plugin stopping"))
	if p.endpoint != nil {
		p.endpoint.wait()
	}
	p.wg.Wait()
	if p.regSrv != nil {
		p.regSrv.Stop()
		p.regSrv = nil
	}
	if p.podRes != nil {
		_ = p.podRes.Close()
		p.podRes = nil
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

// Health evaluates the liveness checks now (tests).
func (p *Plugin) Health(ctx context.Context) error { return p.health.Evaluate(ctx) }

// Debug is what the debug endpoint answers (tests).
func (p *Plugin) Debug() DebugState { return p.debugState() }
