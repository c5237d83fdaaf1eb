// Command vgpu-kubelet-plugin is the DRA kubelet plugin of vgpu-dra: it publishes the node's
// GPUs as shareable devices and prepares ResourceClaims for the kubelet. Flags → Config → run.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
	"github.com/vgpu-dra/vgpu-dra/pkg/featuregates"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
	"github.com/vgpu-dra/vgpu-dra/pkg/toolkitconfig"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "vgpu-kubelet-plugin:", err)
		os.Exit(1)
	}
}

// defaultHealthPort serves the gRPC health service of the liveness and startup probes.
const defaultHealthPort = 51515

// flags holds the plugin's own flags and values that need conversion before they become Config;
// the flags every binary shares are in common.
type flags struct {
	common        *component.Options
	cfg           plugin.Config
	memoryReserve string
	claimFSSize   string
	gpuInjection  string
	enforceSlack  string
	foreignPolicy string
	coreMode      string
	coreMargin    uint
	staleInUse    string
}

func run(args []string) error {
	fs := pflag.NewFlagSet("vgpu-kubelet-plugin", pflag.ContinueOnError)
	f, err := addFlags(fs)
	if err != nil {
		return err
	}
	if help, err := f.common.ParseAndComplete(fs, args); help || err != nil {
		return err
	}
	cfg, err := f.config()
	if err != nil {
		return err
	}
	return component.Run(f.common, func(ctx context.Context) error {
		kube, err := f.common.KubeClient(cfg.NodeName)
		if err != nil {
			return err
		}
		// A second client, with a rate limiter of its own, for the writes off the kubelet's path.
		background, err := f.common.KubeClient(cfg.NodeName)
		if err != nil {
			return err
		}
		metricsAccess, err := f.common.MetricsAccess(cfg.NodeName)
		if err != nil {
			return err
		}
		p, err := plugin.Start(ctx, cfg, plugin.Deps{KubeClient: kube, BackgroundClient: background, MetricsAccess: metricsAccess})
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			klog.FromContext(ctx).Info("Shutting down", "cause", context.Cause(ctx))
		case <-p.Failed():
			// Exit non-zero so that the DaemonSet restarts the plugin (issue 12 item 8).
			klog.FromContext(ctx).Error(p.Err(), "Shutting down after an unrecoverable error")
		}
		p.Stop()
		return p.Err()
	})
}

func addFlags(fs *pflag.FlagSet) (*flags, error) {
	common, err := component.NewOptions("vgpu-kubelet-plugin", defaultHealthPort)
	if err != nil {
		return nil, err
	}
	f := &flags{common: common}
	c := &f.cfg
	fs.StringVar(&c.NodeName, "node-name", os.Getenv("NODE_NAME"), "Name of this node (env NODE_NAME). Required.")
	fs.StringVar(&c.DriverName, "driver-name", contract.DefaultDriverName, "DRA driver name; also the NRI plugin name and the CDI vendor.")
	fs.StringVar(&c.StateDir, "state-dir", contract.DefaultStateDir, "Host directory for claim directories, the registry socket and libvgpu.so.")
	fs.StringVar(&c.KubeletDir, "kubelet-dir", contract.DefaultKubeletDir, "The kubelet's root directory; plugin, registration and checkpoint paths derive from it.")
	fs.StringVar(&c.LibrarySource, "library-source", plugin.DefaultLibrarySource, "libvgpu.so to install into <state-dir>/lib at start-up (with the ld.so.preload file that CDI mounts); empty keeps what is there.")
	fs.StringVar(&c.CDIDir, "cdi-dir", contract.DefaultCDIDir, "Directory the container runtime reads CDI specs from.")
	fs.StringVar(&c.DeviceSource, "device-source", "nvml", `Where GPUs come from: "nvml", or "simulated:<profile>[:<count>]" with profile `+strings.Join(gpu.SimulatedProfiles(), ", ")+".")
	fs.StringVar(&c.MIGGPUs, "mig-gpus", "", `GPUs whose MIG partitions are published beside the whole GPU and created when a claim gets one (contract §18): "all" (every MIG-capable GPU), NVML indexes such as "0,1", or empty for none. The plugin owns the MIG layout of these GPUs: it turns MIG mode on and off as claims need and destroys instances no claim holds.`)
	fs.StringVar(&f.memoryReserve, "memory-reserve", "0", "Memory per GPU kept back from what is published (driver and CUDA contexts), e.g. 1Gi.")
	fs.StringVar(&f.claimFSSize, "claim-fs-size", resource.NewQuantity(plugin.DefaultClaimFSBytes, resource.BinarySI).String(),
		"Size of the tmpfs each claim's directories live on: the hard bound on what a claim's containers can write into /tmp/.vgpu_lock and /tmp/.vmem_node (charged to their memory limits, never the node's disk). 0 keeps them on the state directory's file system without a bound.")
	fs.StringVar(&f.gpuInjection, "gpu-injection", string(cdi.InjectionCDI), "How the GPU itself reaches containers: cdi (the NVIDIA Container Toolkit's CDI device), env (NVIDIA_VISIBLE_DEVICES) or none.")
	fs.StringVar(&c.ToolkitConfig, "toolkit-config", toolkitconfig.DefaultPath, "The NVIDIA Container Toolkit's config.toml, as this process sees it: with --gpu-injection=env, read at start-up to warn when the toolkit honours NVIDIA_VISIBLE_DEVICES from unprivileged containers (any pod can then ask for GPUs) or ignores it there (vGPU containers then get none); a missing file is one info line; empty: not read.")
	fs.StringVar(&c.GPUCDIKind, "gpu-cdi-kind", contract.DefaultGPUCDIKind, "CDI kind of the NVIDIA Container Toolkit's per-GPU devices; empty for none (simulated GPUs).")
	fs.StringVar(&c.NRISocket, "nri-socket", nri.DefaultSocket, "The container runtime's NRI socket (feature gate NRISupport).")
	fs.StringVar(&c.NRIPluginIndex, "nri-plugin-index", nri.DefaultPluginIndex, "NRI plugin index, two digits; the runtime sees <index>-<driver name>.")
	fs.DurationVar(&c.NRIFailureGrace, "nri-failure-grace", nri.DefaultFailureGrace, "After a good NRI session, how long NRI may be lost before the liveness probe fails.")
	fs.DurationVar(&c.ReconcileInterval, "reconcile-interval", plugin.DefaultReconcileInterval, "How often claims prepared on this node are checked against the API server, and those no longer in use here unprepared (also once at start-up); 0: only at start-up.")
	fs.StringVar(&f.staleInUse, "stale-claim-containers", string(driver.StaleInUseKeep), "What the reconciliation does with containers that still run with a claim the API server no longer has in use on this node (deleted, deallocated, reserved for nobody): keep (the claim stays prepared, its capacity held, until they stop; a Warning event on each pod) or stop (kill their processes, then unprepare the claim).")
	fs.StringVar(&c.PodUID, "pod-uid", os.Getenv("POD_UID"), "UID of this instance's pod (env POD_UID, the downward API's metadata.uid): its kubelet sockets are named after it, and the node is handed over to a new instance, or taken over from the running one, while pods keep starting. Empty: one instance at a time.")
	fs.DurationVar(&c.UsageInterval, "usage-interval", usage.DefaultInterval, "How often each vGPU container's memory and core use is sampled for /metrics (its ledger, vgpu.config, pids.config and NVML's per-process figures); 0 disables the per-container and per-GPU usage metrics.")
	fs.IntVar(&c.UsageMaxSeries, "usage-max-series", usage.DefaultMaxSeries, "Most (container, GPU) pairs the per-container metrics show; the rest are counted in vgpu_dra_usage_series_omitted.")
	fs.BoolVar(&c.Enforce, "enforce", true, "Hold every vGPU container to its claim's memory from the node: a container whose processes hold more than its limit (plus --enforce-slack-per-process each) on a GPU for longer than --enforce-grace, or a process of a vGPU container that holds GPU memory without having registered (libvgpu.so bypassed), has its processes on that GPU killed, with a Warning event on the pod (contract §15).")
	fs.DurationVar(&c.Enforcement.Period, "enforce-period", enforce.DefaultPeriod, "How often the enforcer reads NVML's per-process memory on every shared GPU.")
	fs.DurationVar(&c.Enforcement.Grace, "enforce-grace", enforce.DefaultGrace, "How long a container may stay over its memory limit, or a process hold GPU memory unregistered, before the enforcer kills its processes on that GPU.")
	fs.StringVar(&f.enforceSlack, "enforce-slack-per-process", resource.NewQuantity(enforce.DefaultSlackPerProcess, resource.BinarySI).String(), "GPU memory a process may hold beyond what its allocations charge: the CUDA context the driver charges to each process (measured by hack/gpu-check.sh).")
	fs.StringVar(&f.foreignPolicy, "foreign-gpu-process", string(enforce.PolicyReport), "What the enforcer does about a process that holds memory on a shared GPU and belongs to no vGPU container: report (metric, log) or kill.")
	fs.StringVar(&f.coreMode, "core-enforcement", string(enforce.CoreReport), "What the enforcer does about a container whose SM utilisation on a GPU (NVML's per-process samples of its processes, summed), averaged over --core-enforce-window, exceeds its claim's cores by more than --core-enforce-margin points: report (metric, log, one Warning event per episode), throttle (also freeze its cgroups in a duty cycle until it is back under; needs /sys/fs/cgroup writable) or off.")
	fs.UintVar(&f.coreMargin, "core-enforce-margin", enforce.DefaultCoreMargin, "Percentage points (1-100) a container's average SM utilisation may exceed its claim's cores by before --core-enforcement acts.")
	fs.DurationVar(&c.Enforcement.CoreWindow, "core-enforce-window", enforce.DefaultCoreWindow, "The span a container's SM utilisation is averaged over for --core-enforcement.")
	fs.DurationVar(&c.Enforcement.CorePeriod, "core-period", enforce.DefaultCorePeriod, "How often the enforcer reads NVML's per-process SM utilisation on every shared GPU and the compute arbiter divides each GPU between its containers (contract §16): a burst above a container's cores is given back one period after another container wants its part.")
	fs.StringVar(&c.DebugSocket, "debug-socket", "", `Unix socket of the JSON debug endpoint (NRI state, cache, prepared claims); default <state-dir>/debug.sock, "-" disables it.`)
	common.AddFlags(fs)
	return f, nil
}

// config turns the flags into the plugin's Config. The shared flags are complete by then.
func (f *flags) config() (plugin.Config, error) {
	c := f.cfg
	c.VGPU = f.common.Enabled(featuregates.VGPUSupport)
	c.NRI = f.common.Enabled(featuregates.NRISupport)
	c.HealthCheck = f.common.Enabled(featuregates.DeviceHealthCheck)
	c.HealthAddress = f.common.HealthAddress()
	c.MetricsAddress = f.common.MetricsAddress
	q, err := resource.ParseQuantity(f.memoryReserve)
	if err != nil {
		return c, fmt.Errorf("--memory-reserve %q: %w", f.memoryReserve, err)
	}
	c.MemoryReserve = q.Value()
	slack, err := resource.ParseQuantity(f.enforceSlack)
	if err != nil {
		return c, fmt.Errorf("--enforce-slack-per-process %q: %w", f.enforceSlack, err)
	}
	c.Enforcement.SlackPerProcess = slack.Value()
	c.Enforcement.Foreign = enforce.Policy(f.foreignPolicy)
	c.Enforcement.Cores = enforce.CoreMode(f.coreMode)
	if f.coreMargin < 1 || f.coreMargin > 100 {
		return c, fmt.Errorf("--core-enforce-margin %d: want 1-100", f.coreMargin)
	}
	c.Enforcement.CoreMargin = uint32(f.coreMargin)
	if q, err = resource.ParseQuantity(f.claimFSSize); err != nil {
		return c, fmt.Errorf("--claim-fs-size %q: %w", f.claimFSSize, err)
	}
	c.ClaimFSBytes = q.Value()
	c.GPUInjection = cdi.Injection(f.gpuInjection)
	c.StaleClaimContainers = driver.StaleInUsePolicy(f.staleInUse)
	return c, c.Validate()
}
