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
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
)

// serveSimulatedControl serves the simulated GPUs' control endpoint (contract §11) on a unix
// socket of mode 0600 until ctx ends or the returned stop is called, when the GPUs are
// simulated; real GPUs have none (stop does nothing then).
func serveSimulatedControl(ctx context.Context, path string, src gpu.Source) (stop func(), err error) {
	sim, ok := src.(*gpu.Simulated)
	if !ok || path == "" {
		return func() {}, nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove stale simulated-GPU control socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on simulated-GPU control socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, fmt.Errorf("set mode of simulated-GPU control socket %s: %w", path, err)
	}
	srv := &http.Server{Handler: sim.ControlHandler(), ReadHeaderTimeout: 5 * time.Second}
	stop = nri.ServeUntil(ctx, srv, lis, path, "Simulated-GPU control")
	klog.FromContext(ctx).Info("Simulated GPUs' health can be driven through the control socket", "socket", path)
	return stop, nil
}
