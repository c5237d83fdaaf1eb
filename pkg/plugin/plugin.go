package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/health"
	"github.com/vgpu-dra/vgpu-dra/pkg/instancelock"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// Deps lets tests replace what a node provides.
type Deps struct {
	// KubeClient talks to the API server; built from Config.Kubeconfig (or in-cluster) when nil.
	KubeClient kubernetes.Interface
	// GPUs is the inventory; built from Config.DeviceSource when nil.
	GPUs gpu.Source
	// BootID overrides /proc/sys/kernel/random/boot_id (tests simulate reboots with it).
	BootID string
}

// Plugin is a running kubelet plugin.
type Plugin struct {
	cfg        Config
	cancel     context.CancelCauseFunc
	lock       *instancelock.Lock
	helper     *kubeletplugin.Helper
	gpus       gpu.Source
	ownsGPUs   bool
	driver     *driver.Driver
	metrics    *metrics.Metrics
	health     *health.Server
	healthAddr net.Addr
	done       chan struct{}
	kube       kubernetes.Interface
	nri        *nri.Supervisor // nil when NRI is off
	nriCache   *nri.Cache
	registry   *registry.Server
	store      *checkpoint.Store
}

// Start brings the plugin up: instance lock first (one instance per node), then inventory,
// checkpoint recovery, the kubelet's gRPC services, ResourceSlice publishing, health and
// metrics. It returns once the plugin serves; Stop (or ctx) ends it.
func Start(ctx context.Context, cfg Config, deps Deps) (_ *Plugin, finalErr error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	p := &Plugin{cfg: cfg, cancel: cancel, metrics: metrics.New(), health: health.NewServer(), done: make(chan struct{})}
	defer func() {
		if finalErr != nil {
			p.Stop()
		}
	}()

	lock, err := instancelock.Acquire(ctx, cfg.InstanceLockPath())
	if err != nil {
		return nil, err
	}
	p.lock = lock

	if p.gpus = deps.GPUs; p.gpus == nil {
		if p.gpus, err = gpu.ParseSource(cfg.DeviceSource); err != nil {
			return nil, fmt.Errorf("open GPU source %q: %w", cfg.DeviceSource, err)
		}
		p.ownsGPUs = true
	}
	devices, err := p.gpus.Devices(ctx)
	if err != nil {
		return nil, fmt.Errorf("list GPUs: %w", err)
	}
	logger.Info("GPU inventory", "source", cfg.DeviceSource, "gpus", len(devices))

	kube := deps.KubeClient
	if kube == nil {
		if kube, err = newKubeClient(cfg); err != nil {
			return nil, err
		}
	}

	p.kube = kube
	d, err := p.newDriver(ctx, devices, deps.BootID)
	if err != nil {
		return nil, err
	}
	p.driver = d
	// The registry serves before NRI connects: until the first Synchronize it answers RETRY
	// (the readiness gate), never a wrong directory.
	if err := p.startRegistry(ctx, p.store); err != nil {
		return nil, err
	}
	// NRI connects once the checkpoint is loaded and recovered, before the kubelet can call.
	if err := p.startNRI(ctx); err != nil {
		return nil, err
	}

	watch := &registrationWatch{}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(cfg.DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(kube),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir()),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDataDir()),
		// Serialize(false): the driver locks per claim (see driver/claimlocks.go).
		kubeletplugin.Serialize(false),
		kubeletplugin.GRPCInterceptor(watch.interceptor),
		kubeletplugin.HealthService(cfg.HealthCheck),
	)
	if err != nil {
		return nil, fmt.Errorf("start kubelet plugin services: %w", err)
	}
	p.helper = helper

	var events chan gpu.HealthEvent
	if cfg.HealthCheck {
		events = make(chan gpu.HealthEvent, 16)
		go func() {
			if err := p.gpus.WatchHealth(ctx, events); err != nil {
				logger.Error(err, "GPU health watch ended")
			}
		}()
	}
	d.Start(ctx, helper, events)

	p.health.Add("kubelet-registration", watch.check(cfg.RegistrarSocket()))
	p.health.Add("dra-socket", draSocketCheck(cfg.DRASocket()))
	if cfg.HealthAddress != "" {
		if p.healthAddr, err = p.health.Serve(ctx, cfg.HealthAddress); err != nil {
			return nil, err
		}
	}
	if err := p.metrics.Serve(ctx, cfg.MetricsAddress); err != nil {
		return nil, err
	}
	go func() {
		<-ctx.Done()
		close(p.done)
	}()
	logger.Info("Kubelet plugin started", "driver", cfg.DriverName, "node", cfg.NodeName, "vgpu", cfg.VGPU, "nri", cfg.NRI)
	return p, nil
}

func (p *Plugin) newDriver(ctx context.Context, devices []gpu.Device, bootID string) (*driver.Driver, error) {
	cfg := p.cfg
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("create state dir %s: %w", cfg.StateDir, err)
	}
	store, err := checkpoint.Open(cfg.CheckpointPath())
	if err != nil {
		return nil, err
	}
	p.store = store
	dirs := claimdir.Layout{StateDir: cfg.StateDir}
	libraryInstalled := false
	if cfg.VGPU {
		if libraryInstalled, err = installLibrary(klog.FromContext(ctx), cfg.LibrarySource, dirs); err != nil {
			return nil, err
		}
	}
	if cfg.VGPU && !libraryInstalled {
		klog.FromContext(ctx).Info("libvgpu.so is not installed in the state dir: containers get limits in their env but nothing enforces them",
			"library", dirs.LibraryPath(), "preload", dirs.PreloadPath())
	}
	writer, err := cdi.NewWriter(cdi.Options{
		DriverName: cfg.DriverName, SpecDir: cfg.CDIDir,
		RegistryDir: dirs.RegistryDir(), LibraryPath: dirs.LibraryPath(), PreloadPath: dirs.PreloadPath(),
		LibraryInstalled: libraryInstalled, VGPU: cfg.VGPU,
		GPUInjection: cfg.GPUInjection, GPUCDIKind: cfg.GPUCDIKind,
	})
	if err != nil {
		return nil, err
	}
	if bootID == "" {
		bootID = readBootID()
	}
	// Simulated GPUs carry made-up PCI addresses that may name a real device of this host
	// (0000:00:00.0 is the host bridge): only real GPUs get a pcieRoot from sysfs.
	var pcieRoot func(string) (deviceattribute.DeviceAttribute, error)
	if _, simulated := p.gpus.(*gpu.Simulated); !simulated {
		pcieRoot = func(busID string) (deviceattribute.DeviceAttribute, error) {
			return deviceattribute.GetPCIeRootAttributeByPCIBusID(busID)
		}
	}
	d, err := driver.New(driver.Config{
		DriverName: cfg.DriverName, NodeName: cfg.NodeName, MemoryReserve: cfg.MemoryReserve,
		VGPU: cfg.VGPU, BootID: bootID,
	}, driver.Deps{
		Devices: devices, Checkpoint: store, CDI: writer, Dirs: dirs, Metrics: p.metrics,
		Paths: p.claimPaths(store, dirs), PCIeRoot: pcieRoot, NewUUID: func() string { return string(uuid.NewUUID()) },
	})
	if err != nil {
		return nil, err
	}
	if err := d.Recover(ctx); err != nil {
		return nil, fmt.Errorf("recover prepared claims from %s: %w", cfg.CheckpointPath(), err)
	}
	return d, nil
}

// Stop ends every goroutine and server, then releases the instance lock. Safe to call twice.
func (p *Plugin) Stop() {
	p.cancel(errors.New("plugin stopping"))
	if p.helper != nil {
		p.helper.Stop()
		p.helper = nil
	}
	if p.registry != nil {
		p.registry.Stop()
		p.registry = nil
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

// Done is closed when the plugin's context ends.
func (p *Plugin) Done() <-chan struct{} { return p.done }

// Driver exposes the driver (tests, debug).
func (p *Plugin) Driver() *driver.Driver { return p.driver }

// Metrics exposes the metrics registry (tests).
func (p *Plugin) Metrics() *metrics.Metrics { return p.metrics }

// Health exposes the health checks (tests).
func (p *Plugin) Health() *health.Server { return p.health }

// HealthAddr is the bound health address, nil when disabled.
func (p *Plugin) HealthAddr() net.Addr { return p.healthAddr }

func newKubeClient(cfg Config) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("build Kubernetes client config: %w", err)
	}
	// The helper GETs every claim before the driver sees it; client-go's default 5 QPS would
	// turn a burst of pods into seconds of waiting (performance.md).
	rc.QPS, rc.Burst = cfg.KubeAPIQPS, cfg.KubeAPIBurst
	rc.UserAgent = "vgpu-kubelet-plugin/" + cfg.NodeName
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes client: %w", err)
	}
	return cs, nil
}

func readBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
