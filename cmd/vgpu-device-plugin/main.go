// Command vgpu-device-plugin offers the node's GPUs as shares of an extended resource through
// the kubelet's device-plugin API, with the same enforced limits as the DRA kubelet plugin
// (contract §13). Flags → Config → run.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/deviceplugin"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
	"github.com/vgpu-dra/vgpu-dra/pkg/featuregates"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "vgpu-device-plugin:", err)
		os.Exit(1)
	}
}

// defaultHealthPort serves the gRPC health service of the probes; not the kubelet plugin's
// 51515, so that both can share a host network.
const defaultHealthPort = 51516

// flags holds the plugin's own flags and the values that need conversion into Config.
type flags struct {
	common        *component.Options
	cfg           deviceplugin.Config
	memoryReserve string
	shareMemory   string
	claimFSSize   string
	gpuInjection  string
	policy        string
	enforceSlack  string
	foreignPolicy string
	coreMode      string
	coreMargin    uint
}

func run(args []string) error {
	fs := pflag.NewFlagSet("vgpu-device-plugin", pflag.ContinueOnError)
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
		metricsAccess, err := f.common.MetricsAccess(cfg.NodeName)
		if err != nil {
			return err
		}
		p, err := deviceplugin.Start(ctx, cfg, deviceplugin.Deps{KubeClient: kube, MetricsAccess: metricsAccess})
		if err != nil {
			return err
		}
		<-ctx.Done()
		klog.FromContext(ctx).Info("Shutting down", "cause", context.Cause(ctx))
		p.Stop()
		return nil
	})
}

func addFlags(fs *pflag.FlagSet) (*flags, error) {
	common, err := component.NewOptions("vgpu-device-plugin", defaultHealthPort)
	if err != nil {
		return nil, err
	}
	f := &flags{common: common}
	c := &f.cfg
	fs.StringVar(&c.NodeName, "node-name", os.Getenv("NODE_NAME"), "Name of this node (env NODE_NAME). Required.")
	fs.StringVar(&c.DriverName, "driver-name", contract.DefaultDriverName, "CDI vendor of the shares' spec; names the instance lock shared with the kubelet plugin.")
	fs.StringVar(&c.ResourceName, "resource-name", contract.DefaultResourceName, "Extended resource the shares are offered as; also the prefix of the node labels with their sizes.")
	fs.StringVar(&c.StateDir, "state-dir", contract.DefaultStateDir, "Host directory for share directories, the registry socket and libvgpu.so.")
	fs.StringVar(&c.KubeletDir, "kubelet-dir", contract.DefaultKubeletDir, "The kubelet's root directory; the device-plugin and pod-resources sockets derive from it.")
	fs.StringVar(&c.CDIDir, "cdi-dir", contract.DefaultCDIDir, "Directory the container runtime reads CDI specs from.")
	fs.StringVar(&c.LibrarySource, "library-source", contract.DefaultLibrarySource, "libvgpu.so to install into <state-dir>/lib at start-up; empty keeps what is there.")
	fs.StringVar(&c.DeviceSource, "device-source", "nvml", `Where GPUs come from: "nvml", or "simulated:<profile>[:<count>]" with profile `+strings.Join(gpu.SimulatedProfiles(), ", ")+".")
	fs.StringVar(&f.memoryReserve, "memory-reserve", "0", "Memory per GPU kept back before it is shared (driver and CUDA contexts), e.g. 1Gi.")
	fs.IntVar(&c.Sizing.SharesPerGPU, "shares-per-gpu", deviceplugin.DefaultSharesPerGPU, "Shares each GPU is cut into: the devices of the extended resource per GPU.")
	fs.StringVar(&f.shareMemory, "share-memory", "", "Memory limit of each share, e.g. 10Gi; empty: an equal split of each GPU's memory after the reserve.")
	fs.Int64Var(&c.Sizing.ShareCores, "share-cores", 0, "Compute limit of each share in percent of the GPU's SMs, 1-100; 0 is unlimited.")
	fs.StringVar(&f.policy, "allocation-policy", string(deviceplugin.PolicyBinpack), "How the kubelet is advised to pick shares: binpack (fewest GPUs, fullest first) or spread (most GPUs, emptiest first).")
	fs.StringVar(&f.claimFSSize, "claim-fs-size", resource.NewQuantity(deviceplugin.DefaultClaimFSBytes, resource.BinarySI).String(),
		"Size of the tmpfs each container's share directories live on: the hard bound on what it can write into /tmp/.vgpu_lock and /tmp/.vmem_node. 0 keeps them on the state directory's file system without a bound.")
	fs.StringVar(&f.gpuInjection, "gpu-injection", string(cdi.InjectionCDI), "How the GPU itself reaches containers: cdi (the NVIDIA Container Toolkit's CDI device), env (NVIDIA_VISIBLE_DEVICES) or none.")
	fs.StringVar(&c.GPUCDIKind, "gpu-cdi-kind", contract.DefaultGPUCDIKind, "CDI kind of the NVIDIA Container Toolkit's per-GPU devices; empty for none (simulated GPUs).")
	fs.StringVar(&c.DebugSocket, "debug-socket", "", `Unix socket of the JSON debug endpoint (shares, health, registration); default <state-dir>/`+contract.DevicePluginDebugSocketName+`, "-" disables it.`)
	fs.BoolVar(&c.Enforce, "enforce", true, "Hold every container that holds shares to their memory from the node, as the kubelet plugin does: a pod whose processes hold more than its shares' memory (plus --enforce-slack-per-process each) on a GPU for longer than --enforce-grace, or a process of such a pod that holds GPU memory without having registered (libvgpu.so bypassed), has its processes on that GPU killed, with a Warning event on the pod (contract §15).")
	fs.DurationVar(&c.Enforcement.Period, "enforce-period", enforce.DefaultPeriod, "How often the enforcer reads NVML's per-process memory on every shared GPU (and the kubelet's record of who holds which shares).")
	fs.DurationVar(&c.Enforcement.Grace, "enforce-grace", enforce.DefaultGrace, "How long a container may stay over its memory limit, or a process hold GPU memory unregistered, before the enforcer kills its processes on that GPU.")
	fs.StringVar(&f.enforceSlack, "enforce-slack-per-process", resource.NewQuantity(enforce.DefaultSlackPerProcess, resource.BinarySI).String(), "GPU memory a process may hold beyond what its allocations charge: the CUDA context the driver charges to each process (measured by hack/gpu-check.sh).")
	fs.StringVar(&f.foreignPolicy, "foreign-gpu-process", string(enforce.PolicyReport), "What the enforcer does about a process that holds memory on a shared GPU and belongs to no pod that holds shares: report (metric, log) or kill.")
	fs.StringVar(&f.coreMode, "core-enforcement", string(enforce.CoreReport), "What the enforcer does about a container whose SM utilisation on a GPU (NVML's per-process samples of its processes, summed), averaged over --core-enforce-window, exceeds its shares' cores by more than --core-enforce-margin points: report (metric, log, one Warning event per episode), throttle (also freeze its cgroups in a duty cycle until it is back under; needs /sys/fs/cgroup writable) or off.")
	fs.UintVar(&f.coreMargin, "core-enforce-margin", enforce.DefaultCoreMargin, "Percentage points (1-100) a container's average SM utilisation may exceed its shares' cores by before --core-enforcement acts.")
	fs.DurationVar(&c.Enforcement.CoreWindow, "core-enforce-window", enforce.DefaultCoreWindow, "The span a container's SM utilisation is averaged over for --core-enforcement.")
	fs.DurationVar(&c.Enforcement.CorePeriod, "core-period", enforce.DefaultCorePeriod, "How often the enforcer reads NVML's per-process SM utilisation on every shared GPU and the compute arbiter divides each GPU between its containers (contract §16): a burst above a container's cores is given back one period after another container wants its part.")
	common.AddFlags(fs)
	return f, nil
}

// config turns the flags into the plugin's Config. The shared flags are complete by then.
func (f *flags) config() (deviceplugin.Config, error) {
	c := f.cfg
	if !f.common.Enabled(featuregates.VGPUSupport) {
		return c, errors.New("the device plugin offers vGPU shares only: feature gate VGPUSupport must be on (NRISupport has no effect here)")
	}
	c.HealthCheck = f.common.Enabled(featuregates.DeviceHealthCheck)
	c.HealthAddress = f.common.HealthAddress()
	c.MetricsAddress = f.common.MetricsAddress
	c.Policy = deviceplugin.Policy(f.policy)
	c.GPUInjection = cdi.Injection(f.gpuInjection)
	var err error
	if c.Sizing.MemoryReserve, err = quantity("--memory-reserve", f.memoryReserve); err != nil {
		return c, err
	}
	if c.Sizing.ShareMemory, err = quantity("--share-memory", f.shareMemory); err != nil {
		return c, err
	}
	if c.ClaimFSBytes, err = quantity("--claim-fs-size", f.claimFSSize); err != nil {
		return c, err
	}
	if c.Enforcement.SlackPerProcess, err = quantity("--enforce-slack-per-process", f.enforceSlack); err != nil {
		return c, err
	}
	c.Enforcement.Foreign = enforce.Policy(f.foreignPolicy)
	c.Enforcement.Cores = enforce.CoreMode(f.coreMode)
	if f.coreMargin < 1 || f.coreMargin > 100 {
		return c, fmt.Errorf("--core-enforce-margin %d: want 1-100", f.coreMargin)
	}
	c.Enforcement.CoreMargin = uint32(f.coreMargin)
	return c, c.Validate()
}

// quantity parses a flag's resource quantity into bytes; empty is 0.
func quantity(flag, value string) (int64, error) {
	if value == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(value)
	if err != nil {
		return 0, fmt.Errorf("%s %q: %w", flag, value, err)
	}
	return q.Value(), nil
}
