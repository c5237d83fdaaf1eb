package driver

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// HandleError implements kubeletplugin.DRAPlugin: the helper reports errors of its background
// work here. Every one is counted (helper_errors_total{severity}).
//
// Recoverable ones (errors.Is kubeletplugin.ErrRecoverable: ResourceSlice publishing, which the
// helper retries, and stale health reports) are logged with the context the helper attached
// and what this node is. Invalid slices and dropped fields are marked as such: retrying will not
// resolve them, but restarting will not either.
//
// Any other error means the helper's gRPC servers (DRA socket, registration) have failed: the
// kubelet can no longer reach this plugin and nothing in the process brings them back, so
// OnFatal is told and the process exits; the DaemonSet restarts it, and start-up recovery
// makes the restarted plugin consistent with the checkpoint.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	logger := klog.FromContext(ctx).WithValues("driver", d.cfg.DriverName, "node", d.cfg.NodeName)
	ctx = klog.NewContext(ctx, logger)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.dra.HelperErrors.WithLabelValues(metrics.SeverityFatal).Inc()
		logger.Error(err, "The DRA helper failed and cannot recover; exiting so that the plugin is restarted", "what", msg)
		d.fatalOnce.Do(func() {
			if d.deps.OnFatal != nil {
				d.deps.OnFatal(fmt.Errorf("DRA helper: %s: %w", msg, err))
			}
		})
		return
	}
	d.dra.HelperErrors.WithLabelValues(metrics.SeverityRecoverable).Inc()
	var dropped *resourceslice.DroppedFieldsError
	switch {
	case errors.As(err, &dropped):
		msg += " (the API server dropped fields: is a needed feature gate off?)"
	case apierrors.IsInvalid(err):
		msg += " (the API server rejected the ResourceSlice)"
	}
	runtime.HandleErrorWithContext(ctx, err, msg)
}
