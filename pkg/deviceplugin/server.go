package deviceplugin

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// pluginOptions are what GetDevicePluginOptions answers and what registration sends: the
// kubelet asks for a preferred allocation, and needs no PreStartContainer call.
func pluginOptions() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// service implements the kubelet's DevicePlugin gRPC service.
type service struct {
	pluginapi.UnimplementedDevicePluginServer

	inv     *Inventory
	devices *devices
	alloc   *allocator
	policy  Policy
	metrics *metrics.DevicePluginMetrics
	logger  logr.Logger
	now     func() time.Time
	// streams counts the open ListAndWatch streams (endpoint.check reads it).
	streams *atomic.Int64
}

var _ pluginapi.DevicePluginServer = (*service)(nil)

// GetDevicePluginOptions answers the options registration sent.
func (s *service) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return pluginOptions(), nil
}

// ListAndWatch sends every share with its health, then the whole list again after every
// change, until the kubelet goes away or the server stops.
func (s *service) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if s.streams != nil {
		s.streams.Add(1)
		defer s.streams.Add(-1)
	}
	for {
		list, changed := s.devices.list()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: list}); err != nil {
			return err
		}
		s.logger.V(2).Info("Sent the shares to the kubelet", "shares", len(list))
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// Allocate answers each container's request (allocator.allocate). An ID that is not this
// node's, a repeated one, or one whose GPU is unhealthy is refused with a status that names it
// (InvalidArgument, FailedPrecondition); a directory that cannot be made is Internal.
func (s *service) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{ContainerResponses: make([]*pluginapi.ContainerAllocateResponse, 0, len(req.ContainerRequests))}
	for _, cr := range req.ContainerRequests {
		start := s.now()
		cresp, err := s.alloc.allocate(cr.DevicesIds)
		code, reason := allocateErrorCode(err)
		s.metrics.ObserveAllocate(s.now().Sub(start), reason)
		if err != nil {
			s.logger.Error(err, "Allocate refused", "devices", cr.DevicesIds)
			return nil, status.Errorf(code, "allocate %v: %v", cr.DevicesIds, err)
		}
		s.logger.V(2).Info("Allocated", "devices", cr.DevicesIds, "cdiDevices", len(cresp.CdiDevices))
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

// allocateErrorCode maps an allocation error to its gRPC code and metric reason.
func allocateErrorCode(err error) (codes.Code, string) {
	var fsErr *FilesystemError
	switch {
	case err == nil:
		return codes.OK, ""
	case errors.Is(err, ErrUnhealthyShare):
		return codes.FailedPrecondition, metrics.ReasonUnhealthyDevice
	case errors.As(err, &fsErr):
		return codes.Internal, metrics.ReasonFilesystem
	default:
		return codes.InvalidArgument, metrics.ReasonInvalidDevice
	}
}

// GetPreferredAllocation answers each container's preference by the policy. It never fails:
// an error here fails the pod's admission, so an internal failure is logged and answered with
// a best-effort choice.
func (s *service) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{ContainerResponses: make([]*pluginapi.ContainerPreferredAllocationResponse, 0, len(req.ContainerRequests))}
	for _, cr := range req.ContainerRequests {
		start := s.now()
		ids, err := s.inv.preferredSafe(s.policy, cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, int(cr.AllocationSize))
		s.metrics.PreferredDuration.Observe(s.now().Sub(start).Seconds())
		if err != nil {
			s.logger.Error(err, "Preferred allocation failed; answered a best-effort choice", "available", cr.AvailableDeviceIDs, "mustInclude", cr.MustIncludeDeviceIDs, "size", cr.AllocationSize)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// PreStartContainer is not asked for (pluginOptions); it answers nothing to do.
func (s *service) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
