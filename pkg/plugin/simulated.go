package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"time"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// serveSimulatedControl serves the simulated GPUs' control endpoint (contract §11) on a unix
// socket of mode 0600 until ctx ends, when the GPUs are simulated; real GPUs have none.
func serveSimulatedControl(ctx context.Context, path string, src gpu.Source) error {
	sim, ok := src.(*gpu.Simulated)
	if !ok || path == "" {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale simulated-GPU control socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listen on simulated-GPU control socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return fmt.Errorf("set mode of simulated-GPU control socket %s: %w", path, err)
	}
	srv := &http.Server{Handler: sim.ControlHandler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
		_ = os.Remove(path)
	}()
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Simulated-GPU control server stopped", "socket", path)
		}
	}()
	klog.FromContext(ctx).Info("Simulated GPUs' health can be driven through the control socket", "socket", path)
	return nil
}
