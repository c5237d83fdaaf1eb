package plugin

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// slicePublisher publishes the node's ResourceSlice through the DRA library's ResourceSlice
// controller, as the kubelet plugin helper's PublishResources does, but for one ownership term
// only (contract §14): the helper serves the kubelet for the process's life and cannot stop its
// controller without stopping the gRPC servers, and a controller left running in an instance
// that handed the node over would put back its own view of the slice over the new owner's (a
// taint the new owner added, say). Stop ends it; the slice stays as published.
type slicePublisher struct {
	kube    kubernetes.Interface
	driver  string
	node    string
	onError func(ctx context.Context, err error, msg string)
	ctx     context.Context
	mu      sync.Mutex
	ctrl    *resourceslice.Controller
	stopped bool
}

func newSlicePublisher(ctx context.Context, cfg Config, kube kubernetes.Interface, onError func(context.Context, error, string)) *slicePublisher {
	logger := klog.LoggerWithName(klog.FromContext(ctx), "ResourceSlice controller")
	return &slicePublisher{kube: kube, driver: cfg.DriverName, node: cfg.NodeName, onError: onError, ctx: klog.NewContext(ctx, logger)}
}

// PublishResources implements driver.Publisher.
func (s *slicePublisher) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("this instance no longer owns the node's ResourceSlices")
	}
	if s.ctrl != nil {
		s.ctrl.Update(&res)
		return nil
	}
	ctrl, err := resourceslice.StartController(s.ctx, resourceslice.Options{
		DriverName: s.driver,
		KubeClient: s.kube,
		Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: s.node},
		Resources:  &res,
		// As the helper does: a publishing error is never a reason to exit.
		ErrorHandler: func(ctx context.Context, err error, msg string) { s.onError(ctx, recoverable{err}, msg) },
	})
	if err != nil {
		return fmt.Errorf("start ResourceSlice controller: %w", err)
	}
	s.ctrl = ctrl
	return nil
}

// Stop ends publishing; the slices stay as they are for the next owner.
func (s *slicePublisher) Stop() {
	s.mu.Lock()
	ctrl := s.ctrl
	s.stopped, s.ctrl = true, nil
	s.mu.Unlock()
	ctrl.Stop()
}

// recoverable marks an error as kubeletplugin.ErrRecoverable, as the helper marks publishing
// errors, so that the driver's HandleError counts and logs it instead of exiting.
type recoverable struct{ error }

func (e recoverable) Is(target error) bool { return target == kubeletplugin.ErrRecoverable }
func (e recoverable) Unwrap() error        { return e.error }
