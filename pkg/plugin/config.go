// Package plugin is the composition root of the vgpu-kubelet-plugin process: Start builds what
// every instance runs (GPU inventory, NRI side, probes), and the instance that holds the lock
// builds its ownership term in dependency order (checkpoint, driver and recovery, NRI
// connection, registry, kubelet services, ResourceSlices). The handover between an owning and an
// incoming instance (contract §14) is implemented here over pkg/handover, and the adapters
// between packages (checkpoint → NRI, NRI cache → registry, checkpoint → registry) live here,
// so that no package imports another only to satisfy its interfaces. cmd turns flags into
// Config; tests start the same assembly in-process with fakes for the API server and the GPUs.
package plugin

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
)

// DefaultClaimFSBytes is the default size of a claim's tmpfs: a container's memory ledger and
// core file take about 200 KiB, so a claim shared by a hundred containers still fits, and what
// a container writes there is charged to its own memory limit.
const DefaultClaimFSBytes = 32 << 20

// DefaultReconcileInterval is how often the prepared claims are checked against the API server
// (--reconcile-interval): a claim the kubelet did not unprepare (the plugin was down) costs its
// GPU share until then.
const DefaultReconcileInterval = 5 * time.Minute

// MinClaimFSBytes is the smallest tmpfs that holds one container's files.
const MinClaimFSBytes = 1 << 20

// Config is everything the process is told on its command line, as plain values.
type Config struct {
	NodeName   string
	DriverName string
	// StateDir holds claim directories, the registry socket and the library (contract §1).
	StateDir string
	// KubeletDir is the kubelet's root; every kubelet path derives from it.
	KubeletDir string
	CDIDir     string
	// LibrarySource is the libvgpu.so the plugin installs into <state>/lib at start-up.
	LibrarySource string
	// DeviceSource is "nvml" or "simulated:<profile>[:<count>]".
	DeviceSource string
	// MemoryReserve is subtracted from every GPU's published memory, in bytes.
	MemoryReserve int64
	// MIGGPUs are the GPUs whose MIG partitions are published and made on demand (--mig-gpus,
	// contract §18): "" none, "all", or NVML indexes separated by commas.
	MIGGPUs string
	// ClaimFSBytes sizes the tmpfs each claim's directories live on (--claim-fs-size); 0 keeps
	// them on the state directory's file system, without a bound.
	ClaimFSBytes int64
	GPUInjection cdi.Injection
	GPUCDIKind   string
	// ToolkitConfig is the NVIDIA Container Toolkit's config.toml (--toolkit-config), read at
	// start-up with GPUInjection env (toolkit.go); empty: not read.
	ToolkitConfig string
	// HealthAddress serves grpc.health.v1 (e.g. ":51515"); empty disables it.
	HealthAddress string
	// MetricsAddress serves /metrics; empty disables it.
	MetricsAddress string
	// UsageInterval is how often per-container usage is sampled for /metrics
	// (--usage-interval); 0 disables the per-container and per-GPU usage metrics.
	UsageInterval time.Duration
	// UsageMaxSeries bounds the (container, GPU) pairs those metrics show (--usage-max-series);
	// usage.DefaultMaxSeries when 0.
	UsageMaxSeries int

	// Enforce holds every vGPU container to its claim's memory from the node (--enforce;
	// pkg/enforce, contract §15): the period, grace, context slack per process and what
	// happens to a process of no vGPU container on a shared GPU.
	Enforce bool
	// Enforcement is the enforcer's settings (--enforce-period, --enforce-grace,
	// --enforce-slack-per-process, --foreign-gpu-process, --core-enforcement,
	// --core-enforce-margin, --core-enforce-window); zero values are the defaults.
	Enforcement enforce.Settings

	// NRISocket is the runtime's NRI socket (--nri-socket); required when NRI is on.
	NRISocket string
	// NRIPluginIndex is the NRI plugin index (--nri-plugin-index); "00" when empty.
	NRIPluginIndex string
	// NRIFailureGrace is how long NRI may be lost, after a good session, before liveness
	// fails (--nri-failure-grace); 3m when zero.
	NRIFailureGrace time.Duration
	// DebugSocket is the debug endpoint's unix socket; <state>/debug.sock when empty, "-" off.
	DebugSocket string
	// ReconcileInterval is how often prepared claims are checked against the API server
	// (--reconcile-interval); 0: only once, at start-up.
	ReconcileInterval time.Duration
	// StaleClaimContainers is what the reconciliation does with the containers that still run
	// with a claim the API server no longer has in use here (--stale-claim-containers): keep
	// the claim prepared until they stop (driver.StaleInUseKeep, the default when empty), or
	// stop them and unprepare it (driver.StaleInUseStop).
	StaleClaimContainers driver.StaleInUsePolicy
	// PodUID is the UID of this instance's pod (--pod-uid, the downward API's metadata.uid).
	// With it, the instance's kubelet sockets are named after the pod (the DRA helper's
	// RollingUpdate) and it can hand the node over to a new instance, or take it over, while
	// pods keep starting (contract §14). Empty: one instance at a time, fixed socket names.
	PodUID string

	// Feature gates, resolved by cmd.
	VGPU        bool
	NRI         bool
	HealthCheck bool
}

// Layout is the host directory layout under the state directory; the one place it is built.
func (c Config) Layout() claimdir.Layout {
	return claimdir.Layout{StateDir: c.StateDir, ClaimFSBytes: c.ClaimFSBytes}
}

// PluginDataDir is the kubelet plugin data directory: <kubelet>/plugins/<driver>.
func (c Config) PluginDataDir() string {
	return filepath.Join(c.KubeletDir, "plugins", c.DriverName)
}

// RegistrarDir is where the kubelet watches for plugin registration sockets.
func (c Config) RegistrarDir() string { return filepath.Join(c.KubeletDir, "plugins_registry") }

// RegistrarSocket is the registration socket the helper creates for this driver: with a pod UID
// the rolling-update name the helper derives from it (kubelet ≥ 1.33 then uses the newest
// registration of a driver).
func (c Config) RegistrarSocket() string {
	if c.PodUID != "" {
		return filepath.Join(c.RegistrarDir(), kubeletplugin.RollingUpdateRegistrarSocketFile(c.RegistrarDir(), c.DriverName, types.UID(c.PodUID)))
	}
	return filepath.Join(c.RegistrarDir(), c.DriverName+"-reg.sock")
}

// DRASocket is the socket the kubelet calls NodePrepareResources on.
func (c Config) DRASocket() string { return c.draSocketOf(c.PodUID) }

// draSocketOf is the DRA socket of the instance in the pod podUID ("" without one): the helper
// names it dra-<pod UID>.sock under rolling updates.
func (c Config) draSocketOf(podUID string) string {
	if podUID == "" {
		return filepath.Join(c.PluginDataDir(), "dra.sock")
	}
	return filepath.Join(c.PluginDataDir(), "dra-"+podUID+".sock")
}

// HandoverEnabled: this instance can hand the node over and take it over (it knows its pod).
func (c Config) HandoverEnabled() bool { return c.PodUID != "" }

// HandoverSocketPath is where the owner listens for a successor (contract §14).
func (c Config) HandoverSocketPath() string {
	return filepath.Join(c.PluginDataDir(), contract.HandoverSocketName)
}

// DecisionMarkersDir holds the owner's per-container NRI decision marks (contract §14).
func (c Config) DecisionMarkersDir() string {
	return filepath.Join(c.PluginDataDir(), contract.NRIDecisionsDir)
}

// CheckpointPath is <plugin data dir>/checkpoint.json.
func (c Config) CheckpointPath() string {
	return filepath.Join(c.PluginDataDir(), contract.CheckpointFile)
}

// InstanceLockPath is <plugin data dir>/instance.lock.
func (c Config) InstanceLockPath() string {
	return filepath.Join(c.PluginDataDir(), contract.InstanceLockFile)
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("--node-name (or NODE_NAME) is required"))
	}
	if c.DriverName == "" {
		errs = append(errs, errors.New("--driver-name is empty"))
	}
	for flag, dir := range map[string]string{"--state-dir": c.StateDir, "--kubelet-dir": c.KubeletDir, "--cdi-dir": c.CDIDir} {
		if !filepath.IsAbs(dir) {
			errs = append(errs, fmt.Errorf("%s %q must be an absolute path", flag, dir))
		}
	}
	if c.MemoryReserve < 0 {
		errs = append(errs, fmt.Errorf("--memory-reserve must not be negative"))
	}
	if _, _, err := parseMIGGPUs(c.MIGGPUs); err != nil {
		errs = append(errs, err)
	}
	if c.ClaimFSBytes < 0 || (c.ClaimFSBytes > 0 && c.ClaimFSBytes < MinClaimFSBytes) {
		errs = append(errs, fmt.Errorf("--claim-fs-size must be 0 (no bound) or at least %d bytes (1Mi)", MinClaimFSBytes))
	}
	switch c.GPUInjection {
	case cdi.InjectionCDI, cdi.InjectionEnv, cdi.InjectionNone:
	default:
		errs = append(errs, fmt.Errorf("--gpu-injection %q: want cdi, env or none", c.GPUInjection))
	}
	if c.NRI && !c.VGPU {
		errs = append(errs, errors.New("feature gate NRISupport requires VGPUSupport"))
	}
	if c.NRI && c.NRISocket == "" {
		errs = append(errs, errors.New("--nri-socket is required with NRISupport"))
	}
	if len(c.NRIPluginIndex) > 0 && (len(c.NRIPluginIndex) != 2 || c.NRIPluginIndex[0] < '0' || c.NRIPluginIndex[0] > '9' || c.NRIPluginIndex[1] < '0' || c.NRIPluginIndex[1] > '9') {
		errs = append(errs, fmt.Errorf("--nri-plugin-index %q: want two digits", c.NRIPluginIndex))
	}
	if c.UsageInterval < 0 || c.UsageMaxSeries < 0 {
		errs = append(errs, errors.New("--usage-interval and --usage-max-series must not be negative"))
	}
	errs = append(errs, c.Enforcement.Validate()...)
	if c.NRIFailureGrace < 0 {
		errs = append(errs, errors.New("--nri-failure-grace must not be negative"))
	}
	if c.ReconcileInterval < 0 {
		errs = append(errs, errors.New("--reconcile-interval must not be negative"))
	}
	if c.StaleClaimContainers != "" {
		if _, err := driver.ParseStaleInUsePolicy(string(c.StaleClaimContainers)); err != nil {
			errs = append(errs, fmt.Errorf("--stale-claim-containers %w", err))
		}
	}
	if c.PodUID != "" {
		if err := contract.ValidateUID(c.PodUID); err != nil {
			errs = append(errs, fmt.Errorf("--pod-uid: %w", err))
		}
	}
	// Unix socket paths are limited to 108 bytes; the kubelet's and ours must fit.
	// With a pod UID the DRA helper names the registration socket itself and keeps it within
	// the kernel's bound (a hash of the UID when the UID does not fit).
	socks := []string{c.DRASocket(), c.DebugSocketPath(), c.SimulatedControlSocketPath(), c.HandoverSocketPath()}
	if c.PodUID == "" {
		socks = append(socks, c.RegistrarSocket())
	}
	for _, sock := range socks {
		if len(sock) >= 100 {
			errs = append(errs, fmt.Errorf("socket path %s is %d bytes; unix sockets need under 100: shorten --kubelet-dir or --driver-name", sock, len(sock)))
		}
	}
	return errors.Join(errs...)
}

// SimulatedControlSocketPath is where the simulated GPUs' control endpoint listens (contract
// §11), <state>/simulated-gpu.sock; it is served only when the GPUs are simulated.
func (c Config) SimulatedControlSocketPath() string {
	return filepath.Join(c.StateDir, contract.SimulatedControlSocketName)
}

// debugSocketName is the debug socket's name in the state directory when --debug-socket is
// not set.
const debugSocketName = "debug.sock"

// DebugSocketPath is where the debug endpoint listens: DebugSocket, or <state>/debug.sock
// when empty; "-" disables it.
func (c Config) DebugSocketPath() string {
	switch c.DebugSocket {
	case "-":
		return ""
	case "":
		return filepath.Join(c.StateDir, debugSocketName)
	}
	return c.DebugSocket
}
