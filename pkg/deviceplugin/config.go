package deviceplugin

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
)

// Defaults of Config.
const (
	// DefaultSharesPerGPU cuts each GPU into four shares.
	DefaultSharesPerGPU = 4
	// DefaultClaimFSBytes sizes each share's tmpfs: one container's files take ~200 KiB.
	DefaultClaimFSBytes = 8 << 20
	// DefaultKeepInterval is how often the share directories are reconciled with the kubelet;
	// DefaultKeepGrace how long a set is kept after Allocate before it may go.
	DefaultKeepInterval = 5 * time.Second
	DefaultKeepGrace    = 15 * time.Second
)

// Config is everything the device plugin is told on its command line, as plain values.
type Config struct {
	NodeName string
	// DriverName is the CDI vendor, the prefix of the instance lock's directory (shared with
	// the kubelet plugin: one of the two per node) and of nothing else.
	DriverName string
	// ResourceName is the extended resource, e.g. "vgpu.dra.dev/vgpu".
	ResourceName string
	StateDir     string
	KubeletDir   string
	CDIDir       string
	// LibrarySource is the libvgpu.so installed into <state>/lib at start-up.
	LibrarySource string
	// DeviceSource is "nvml" or "simulated:<profile>[:<count>]".
	DeviceSource string
	Sizing       Sizing
	Policy       Policy
	// ClaimFSBytes sizes each share's tmpfs; 0 keeps share directories on the state dir's file
	// system, without a bound.
	ClaimFSBytes int64
	GPUInjection cdi.Injection
	GPUCDIKind   string
	// HealthCheck follows GPU health events (feature gate DeviceHealthCheck).
	HealthCheck bool
	// HealthAddress and MetricsAddress serve grpc.health.v1 and /metrics; empty disables.
	HealthAddress  string
	MetricsAddress string
	// DebugSocket is the debug endpoint's socket; <state>/device-plugin-debug.sock when empty,
	// "-" off.
	DebugSocket string
	// KeepInterval and KeepGrace time the share directory keeper; defaults when zero.
	KeepInterval, KeepGrace time.Duration
	// Enforce holds every container that holds shares to their limits from the node, as the
	// kubelet plugin does (--enforce; pkg/enforce, contract §15), with the same period, grace,
	// context slack per process (0: none) and policy for foreign processes; zero durations are
	// the defaults.
	Enforce bool
	// Enforcement is the enforcer's settings (--enforce-period, --enforce-grace,
	// --enforce-slack-per-process, --foreign-gpu-process, --core-enforcement,
	// --core-enforce-margin, --core-enforce-window); zero values are the defaults.
	Enforcement enforce.Settings
}

// Layout is the host directory layout under the state directory.
func (c Config) Layout() claimdir.Layout {
	return claimdir.Layout{StateDir: c.StateDir, ClaimFSBytes: c.ClaimFSBytes}
}

// DevicePluginDir is <kubelet>/device-plugins, where kubelet.sock and the plugin's socket are.
func (c Config) DevicePluginDir() string {
	return filepath.Join(c.KubeletDir, contract.DevicePluginDirName)
}

// KubeletSocket is the kubelet's Registration socket.
func (c Config) KubeletSocket() string {
	return filepath.Join(c.DevicePluginDir(), contract.KubeletRegistrationSocketName)
}

// Socket is the plugin's own socket: the resource name with '/' as '-', e.g.
// vgpu.dra.dev-vgpu.sock.
func (c Config) Socket() string {
	return filepath.Join(c.DevicePluginDir(), strings.ReplaceAll(c.ResourceName, "/", "-")+".sock")
}

// PodResourcesSocket is the kubelet's pod-resources socket.
func (c Config) PodResourcesSocket() string {
	return filepath.Join(c.KubeletDir, contract.PodResourcesSocketRel)
}

// InstanceLockPath is the kubelet plugin's instance lock, <kubelet>/plugins/<driver>/instance.lock:
// the device plugin takes the same lock, so the two never run on one node at the same time.
func (c Config) InstanceLockPath() string {
	return filepath.Join(c.KubeletDir, "plugins", c.DriverName, contract.InstanceLockFile)
}

// DebugSocketPath is where the debug endpoint listens; "" when disabled.
func (c Config) DebugSocketPath() string {
	switch c.DebugSocket {
	case "-":
		return ""
	case "":
		return filepath.Join(c.StateDir, contract.DevicePluginDebugSocketName)
	}
	return c.DebugSocket
}

func (c Config) keepInterval() time.Duration { return orDefault(c.KeepInterval, DefaultKeepInterval) }
func (c Config) keepGrace() time.Duration    { return orDefault(c.KeepGrace, DefaultKeepGrace) }

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
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
	if err := validateResourceName(c.ResourceName); err != nil {
		errs = append(errs, err)
	}
	for flag, dir := range map[string]string{"--state-dir": c.StateDir, "--kubelet-dir": c.KubeletDir, "--cdi-dir": c.CDIDir} {
		if !filepath.IsAbs(dir) {
			errs = append(errs, fmt.Errorf("%s %q must be an absolute path", flag, dir))
		}
	}
	s := c.Sizing
	if s.SharesPerGPU < 1 {
		errs = append(errs, fmt.Errorf("--shares-per-gpu %d: want at least 1", s.SharesPerGPU))
	}
	if s.MemoryReserve < 0 || s.ShareMemory < 0 {
		errs = append(errs, errors.New("--memory-reserve and --share-memory must not be negative"))
	}
	if s.ShareCores < 0 || s.ShareCores > unlimitedCores {
		errs = append(errs, fmt.Errorf("--share-cores %d: want 0 (unlimited) to 100", s.ShareCores))
	}
	switch c.Policy {
	case PolicyBinpack, PolicySpread:
	default:
		errs = append(errs, fmt.Errorf("--allocation-policy %q: want binpack or spread", c.Policy))
	}
	if c.ClaimFSBytes < 0 || (c.ClaimFSBytes > 0 && c.ClaimFSBytes < 1<<20) {
		errs = append(errs, errors.New("--claim-fs-size must be 0 (no bound) or at least 1Mi"))
	}
	switch c.GPUInjection {
	case cdi.InjectionCDI, cdi.InjectionEnv, cdi.InjectionNone:
	default:
		errs = append(errs, fmt.Errorf("--gpu-injection %q: want cdi, env or none", c.GPUInjection))
	}
	errs = append(errs, c.Enforcement.Validate()...)
	for _, sock := range []string{c.Socket(), c.KubeletSocket(), c.PodResourcesSocket(), c.DebugSocketPath()} {
		if len(sock) >= 100 {
			errs = append(errs, fmt.Errorf("socket path %s is %d bytes; unix sockets need under 100: shorten --kubelet-dir, --state-dir or --resource-name", sock, len(sock)))
		}
	}
	return errors.Join(errs...)
}

// validateResourceName accepts what the kubelet accepts from a device plugin: an extended
// resource name, "<domain>/<name>" outside the kubernetes.io domains, that also makes valid
// label keys with the suffixes of contract §13.
func validateResourceName(name string) error {
	domain, short, ok := strings.Cut(name, "/")
	if !ok || domain == "" || short == "" || domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") {
		return fmt.Errorf("--resource-name %q: want <domain>/<name>, outside kubernetes.io", name)
	}
	for _, suffix := range []string{contract.LabelSuffixSharesPerGPU, contract.LabelSuffixMemoryMiB, contract.LabelSuffixCores, contract.AnnotationSuffixShares} {
		if errs := validation.IsQualifiedName(name + "." + suffix); len(errs) > 0 {
			return fmt.Errorf("--resource-name %q: label %s.%s: %s", name, name, suffix, strings.Join(errs, "; "))
		}
	}
	return nil
}
