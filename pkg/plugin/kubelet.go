package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// registrationWatch learns from the kubelet's own NotifyRegistrationStatus calls whether the
// plugin is registered. The helper's RegistrationStatus() is read without synchronisation (its
// own TODO says so) and trips the race detector; a gRPC interceptor sees the same call safely.
type registrationWatch struct {
	registered atomic.Bool
}

const notifyMethod = "/" + "pluginregistration.Registration" + "/NotifyRegistrationStatus"

func (w *registrationWatch) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod == notifyMethod {
		if st, ok := req.(*registerapi.RegistrationStatus); ok {
			w.registered.Store(st.PluginRegistered)
			if st.PluginRegistered {
				klog.FromContext(ctx).Info("Registered with the kubelet")
			} else {
				klog.FromContext(ctx).Error(errors.New(st.Error), "The kubelet refused the registration")
			}
		}
	}
	return handler(ctx, req)
}

// check fails unless the kubelet has confirmed the registration and the registration socket
// is still where the kubelet watches (a removed socket means the kubelet dropped the plugin:
// a liveness restart re-creates it).
func (w *registrationWatch) check(socket string) func(context.Context) error {
	return func(context.Context) error {
		if !w.registered.Load() {
			return errors.New("not registered with the kubelet yet")
		}
		if _, err := os.Stat(socket); err != nil {
			return fmt.Errorf("registration socket: %w", err)
		}
		return nil
	}
}

// draSocketCheck calls NodePrepareResources with no claims on the DRA socket, through the same
// gRPC server the kubelet uses.
func draSocketCheck(socket string) func(context.Context) error {
	return func(ctx context.Context) error {
		conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("dial DRA socket %s: %w", socket, err)
		}
		defer conn.Close()
		if _, err := drapbv1.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{}); err != nil {
			return fmt.Errorf("DRA socket %s does not answer: %w", socket, err)
		}
		return nil
	}
}
