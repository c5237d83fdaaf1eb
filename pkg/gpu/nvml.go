package gpu

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNVMLNotFound means the NVIDIA management library could not be loaded: no NVIDIA driver on
// the node, or its libraries are not mounted into the plugin's container.
var ErrNVMLNotFound = errors.New("NVML library libnvidia-ml.so.1 not found")

// NewNVML opens the real driver through libnvidia-ml.so.1. A missing library is an error that
// wraps ErrNVMLNotFound.
func NewNVML() (Source, error) {
	src, err := openNVML(nvml.New(), sysfsNUMA{root: hostSysfsRoot}.lookup)
	if err != nil {
		return nil, err
	}
	return src, nil
}

// NewNVMLAt opens the libnvidia-ml.so.1 at path instead of the one the dynamic loader finds:
// the red-team suite (test/escape) reads the library test suite's fake driver through the same
// reader the plugin uses.
func NewNVMLAt(path string) (Source, error) {
	src, err := openNVML(nvml.New(nvml.WithLibraryPath(path)), func(string) (*int, error) { return nil, nil })
	if err != nil {
		return nil, err
	}
	return src, nil
}

// openNVML initialises lib and wraps it in the shared reader. It is where the real and the
// simulated source meet: everything after it is the same code for both.
func openNVML(lib nvml.Interface, numa func(pciBusID string) (*int, error)) (*nvmlSource, error) {
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, fmt.Errorf("initialise NVML: %w: %w (is the NVIDIA driver installed and its "+
			"libraries mounted into this container? A node without NVIDIA GPUs needs a simulated source)",
			ErrNVMLNotFound, ret)
	default:
		return nil, fmt.Errorf("initialise NVML: %w", ret)
	}
	return &nvmlSource{lib: lib, numa: numa, health: defaultHealthTimings}, nil
}
