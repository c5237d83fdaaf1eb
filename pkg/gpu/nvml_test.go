package gpu

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"k8s.io/klog/v2/ktesting"
)

// TestNewNVML opens the real driver. Both outcomes are checked: on a GPU node the inventory
// reads, elsewhere the error says that the library is missing.
func TestNewNVML(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	src, err := NewNVML()
	if err != nil {
		if !errors.Is(err, ErrNVMLNotFound) {
			t.Fatalf("NewNVML: %v; want success or %v", err, ErrNVMLNotFound)
		}
		if src != nil {
			t.Errorf("NewNVML returned a source with its error")
		}
		return
	}
	defer func() {
		if err := src.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	devs, err := src.Devices(ctx)
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	t.Logf("NVML reports %d GPUs: %+v", len(devs), devs)
}

func TestOpenNVMLMissingLibrary(t *testing.T) {
	lib := nvml.New(nvml.WithLibraryPath(filepath.Join(t.TempDir(), "libnvidia-ml.so.1")))
	_, err := openNVML(lib, nil)
	if !errors.Is(err, ErrNVMLNotFound) || !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
		t.Errorf("openNVML error = %v, want %v wrapping %v", err, ErrNVMLNotFound, nvml.ERROR_LIBRARY_NOT_FOUND)
	}
}

func TestOpenNVMLInitFailure(t *testing.T) {
	srv := dgxh200.New()
	srv.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
	_, err := openNVML(srv, nil)
	if !errors.Is(err, nvml.ERROR_DRIVER_NOT_LOADED) || errors.Is(err, ErrNVMLNotFound) {
		t.Errorf("openNVML error = %v, want %v only", err, nvml.ERROR_DRIVER_NOT_LOADED)
	}
}

func TestCloseShutsDownOnce(t *testing.T) {
	srv := dgxh200.New()
	shutdowns := 0
	srv.ShutdownFunc = func() nvml.Return { shutdowns++; return nvml.ERROR_UNKNOWN }
	src, err := openNVML(srv, nil)
	if err != nil {
		t.Fatalf("openNVML: %v", err)
	}
	for range 2 {
		if err := src.Close(); !errors.Is(err, nvml.ERROR_UNKNOWN) {
			t.Errorf("Close = %v, want %v", err, nvml.ERROR_UNKNOWN)
		}
	}
	if shutdowns != 1 {
		t.Errorf("NVML shut down %d times, want 1", shutdowns)
	}
}
