package cdi

import (
	"errors"
	"fmt"
	"path/filepath"

	"tags.cncf.io/container-device-interface/pkg/parser"
)

// Injection says how the GPU itself (device nodes, driver libraries) reaches the container.
type Injection string

const (
	// InjectionCDI lists the GPU's own CDI device ("<GPUCDIKind>=<UUID>") next to ours, so the
	// NVIDIA Container Toolkit's spec supplies device nodes and driver libraries.
	InjectionCDI Injection = "cdi"
	// InjectionEnv sets NVIDIA_VISIBLE_DEVICES on the claim-common device for a runtime hook.
	InjectionEnv Injection = "env"
	// InjectionNone leaves GPU injection to something else (simulated mode, tests).
	InjectionNone Injection = "none"
)

// ErrInvalidOptions marks an Options value that NewWriter refuses.
var ErrInvalidOptions = errors.New("invalid CDI writer options")

// Options configures a Writer. Host paths are absolute; they come from pkg/claimdir.
type Options struct {
	// DriverName is the DRA driver name, e.g. "vgpu.dra.dev"; the CDI kind is "<driver>/claim".
	DriverName string
	// SpecDir is the CDI spec directory, e.g. /var/run/cdi. It is created when missing.
	SpecDir string
	// RegistryDir is <state>/registry, mounted at contract.ContainerRegistryDir.
	RegistryDir string
	// LibraryPath is <state>/lib/libvgpu.so, mounted at contract.ContainerLibraryPath.
	LibraryPath string
	// PreloadPath is <state>/lib/ld.so.preload, mounted at contract.ContainerPreloadPath.
	PreloadPath string
	// LibraryInstalled is decided once at start-up; false: no library and preload mounts.
	LibraryInstalled bool
	// VGPU is the VGPUSupport gate. Off: whole GPUs, no library, no registry mount, no limits
	// and no identity env; image values are still neutralised.
	VGPU bool
	// GPUInjection says how the GPU itself reaches the container.
	GPUInjection Injection
	// GPUCDIKind is the NVIDIA Container Toolkit's CDI kind (contract.DefaultGPUCDIKind);
	// empty: no GPU CDI device is listed.
	GPUCDIKind string
}

// validate checks o and returns the vendor and class of GPUCDIKind (empty when unset).
func (o *Options) validate() (gpuVendor, gpuClass string, err error) {
	if err := parser.ValidateVendorName(o.DriverName); err != nil {
		return "", "", fmt.Errorf("%w: driver name %q: %v", ErrInvalidOptions, o.DriverName, err)
	}
	if err := requireAbs("spec dir", o.SpecDir); err != nil {
		return "", "", err
	}
	switch o.GPUInjection {
	case InjectionCDI, InjectionEnv, InjectionNone:
	default:
		return "", "", fmt.Errorf("%w: GPU injection %q (want %q, %q or %q)",
			ErrInvalidOptions, o.GPUInjection, InjectionCDI, InjectionEnv, InjectionNone)
	}
	if o.VGPU {
		if err := requireAbs("registry dir", o.RegistryDir); err != nil {
			return "", "", err
		}
		if o.LibraryInstalled {
			if err := requireAbs("library path", o.LibraryPath); err != nil {
				return "", "", err
			}
			if err := requireAbs("preload path", o.PreloadPath); err != nil {
				return "", "", err
			}
		}
	}
	if o.GPUCDIKind == "" {
		return "", "", nil
	}
	gpuVendor, gpuClass = parser.ParseQualifier(o.GPUCDIKind)
	if err := parser.ValidateVendorName(gpuVendor); err != nil {
		return "", "", fmt.Errorf("%w: GPU CDI kind %q: %v", ErrInvalidOptions, o.GPUCDIKind, err)
	}
	if err := parser.ValidateClassName(gpuClass); err != nil {
		return "", "", fmt.Errorf("%w: GPU CDI kind %q: %v", ErrInvalidOptions, o.GPUCDIKind, err)
	}
	return gpuVendor, gpuClass, nil
}

func requireAbs(what, path string) error {
	if path == "" || !filepath.IsAbs(path) {
		return fmt.Errorf("%w: %s %q is not an absolute path", ErrInvalidOptions, what, path)
	}
	return nil
}
