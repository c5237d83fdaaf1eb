// Command vgpu-kubelet-plugin is the DRA kubelet plugin of vgpu-dra: it publishes the node's
// GPUs as shareable devices and prepares ResourceClaims for the kubelet. Flags → Config → run.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/component-base/featuregate"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/featuregates"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vgpu-kubelet-plugin:", err)
		os.Exit(1)
	}
}

// flags holds values that need conversion before they become Config.
type flags struct {
	cfg           plugin.Config
	memoryReserve string
	gpuInjection  string
	healthPort    int
	logging       *logsapi.LoggingConfiguration
	gates         featuregate.MutableVersionedFeatureGate
}

func run() error {
	fs := pflag.NewFlagSet("vgpu-kubelet-plugin", pflag.ContinueOnError)
	f, err := addFlags(fs)
	if err != nil {
		return err
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	cfg, err := f.config()
	if err != nil {
		return err
	}
	if err := logsapi.ValidateAndApply(f.logging, f.gates); err != nil {
		return fmt.Errorf("logging flags: %w", err)
	}
	defer logs.FlushLogs()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := klog.Background().WithName("vgpu-kubelet-plugin")
	ctx = klog.NewContext(ctx, logger)

	p, err := plugin.Start(ctx, cfg, plugin.Deps{})
	if err != nil {
		return err
	}
	<-ctx.Done()
	logger.Info("Shutting down", "cause", context.Cause(ctx))
	p.Stop()
	return nil
}

func addFlags(fs *pflag.FlagSet) (*flags, error) {
	gates, err := featuregates.New()
	if err != nil {
		return nil, err
	}
	f := &flags{logging: logsapi.NewLoggingConfiguration(), gates: gates}
	c := &f.cfg
	fs.StringVar(&c.NodeName, "node-name", os.Getenv("NODE_NAME"), "Name of this node (env NODE_NAME). Required.")
	fs.StringVar(&c.DriverName, "driver-name", contract.DefaultDriverName, "DRA driver name; also the NRI plugin name and the CDI vendor.")
	fs.StringVar(&c.StateDir, "state-dir", contract.DefaultStateDir, "Host directory for claim directories, the registry socket and libvgpu.so.")
	fs.StringVar(&c.KubeletDir, "kubelet-dir", contract.DefaultKubeletDir, "The kubelet's root directory; plugin, registration and checkpoint paths derive from it.")
	fs.StringVar(&c.LibrarySource, "library-source", plugin.DefaultLibrarySource, "libvgpu.so to install into <state-dir>/lib at start-up (with the ld.so.preload file that CDI mounts); empty keeps what is there.")
	fs.StringVar(&c.CDIDir, "cdi-dir", contract.DefaultCDIDir, "Directory the container runtime reads CDI specs from.")
	fs.StringVar(&c.DeviceSource, "device-source", "nvml", `Where GPUs come from: "nvml", or "simulated:<profile>[:<count>]" with profile dgx-h200, dgx-h100 or dgx-a100.`)
	fs.StringVar(&f.memoryReserve, "memory-reserve", "0", "Memory per GPU kept back from what is published (driver and CUDA contexts), e.g. 1Gi.")
	fs.StringVar(&f.gpuInjection, "gpu-injection", string(cdi.InjectionCDI), "How the GPU itself reaches containers: cdi (the NVIDIA Container Toolkit's CDI device), env (NVIDIA_VISIBLE_DEVICES) or none.")
	fs.StringVar(&c.GPUCDIKind, "gpu-cdi-kind", contract.DefaultGPUCDIKind, "CDI kind of the NVIDIA Container Toolkit's per-GPU devices; empty for none (simulated GPUs).")
	fs.IntVar(&f.healthPort, "health-port", 51515, "Port of the gRPC health service (liveness and startup probes); negative disables it.")
	fs.StringVar(&c.MetricsAddress, "metrics-address", ":8080", "Address of the Prometheus /metrics endpoint; empty disables it.")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "Kubeconfig file; in-cluster configuration when empty.")
	fs.Float32Var(&c.KubeAPIQPS, "kube-api-qps", 50, "Client-side QPS limit for API requests (client-go's default of 5 turns a burst of pods into seconds).")
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", 100, "Client-side burst for API requests.")
	fs.StringVar(&c.NRISocket, "nri-socket", nri.DefaultSocket, "The container runtime's NRI socket (feature gate NRISupport).")
	fs.StringVar(&c.NRIPluginIndex, "nri-plugin-index", nri.DefaultPluginIndex, "NRI plugin index, two digits; the runtime sees <index>-<driver name>.")
	fs.DurationVar(&c.NRIFailureGrace, "nri-failure-grace", nri.DefaultFailureGrace, "After a good NRI session, how long NRI may be lost before the liveness probe fails.")
	fs.StringVar(&c.DebugSocket, "debug-socket", "", `Unix socket of the JSON debug endpoint (NRI state, cache, prepared claims); default <state-dir>/debug.sock, "-" disables it.`)
	gates.AddFlag(fs)
	logsapi.AddFlags(f.logging, fs)
	return f, nil
}

func (f *flags) config() (plugin.Config, error) {
	c := f.cfg
	if err := featuregates.Validate(f.gates); err != nil {
		return c, err
	}
	c.VGPU = f.gates.Enabled(featuregates.VGPUSupport)
	c.NRI = f.gates.Enabled(featuregates.NRISupport)
	c.HealthCheck = f.gates.Enabled(featuregates.DeviceHealthCheck)
	q, err := resource.ParseQuantity(f.memoryReserve)
	if err != nil {
		return c, fmt.Errorf("--memory-reserve %q: %w", f.memoryReserve, err)
	}
	c.MemoryReserve = q.Value()
	c.GPUInjection = cdi.Injection(f.gpuInjection)
	if f.healthPort >= 0 {
		c.HealthAddress = fmt.Sprintf(":%d", f.healthPort)
	}
	return c, c.Validate()
}
