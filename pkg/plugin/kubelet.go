package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// startKubeletServices serves the kubelet's plugin-registration and DRA gRPC services through
// the DRA helper, for the rest of the process's life, and adds their liveness checks (which only
// an owner runs). The helper serves draDelegate, which passes each call to the driver of the
// current ownership term; draInterceptor holds the calls while a handover is decided and passes
// them to the owner when another instance owns the node. With a pod UID the sockets have the
// helper's rolling-update names, so that two instances can be registered at once and the
// kubelet (≥ 1.33) uses the newest (contract §14). The directories the sockets live in are
// created when missing (the kubelet creates them on its own nodes; outside one, binding would
// fail with "no such file or directory").
func (p *Plugin) startKubeletServices() (*kubeletplugin.Helper, error) {
	cfg := p.cfg
	for _, dir := range []string{cfg.RegistrarDir(), cfg.PluginDataDir()} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("create kubelet plugin directory: %w", err)
		}
	}
	watch := &registrationWatch{}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(cfg.DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(p.deps.KubeClient),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir()),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDataDir()),
		// Serialize(false): the driver locks per claim (see driver/claimlocks.go); across two
		// instances only the owner prepares (the gate), so no file lock is needed either.
		kubeletplugin.Serialize(false),
		kubeletplugin.GRPCInterceptor(watch.interceptor),
		kubeletplugin.GRPCInterceptor(p.draInterceptor),
		kubeletplugin.HealthService(cfg.HealthCheck),
	}
	if cfg.PodUID != "" {
		opts = append(opts, kubeletplugin.RollingUpdate(types.UID(cfg.PodUID)))
	}
	if p.deps.DRAListen != nil {
		opts = append(opts, kubeletplugin.PluginListener(p.deps.DRAListen))
	}
	helper, err := kubeletplugin.Start(p.ctx, p.delegate, opts...)
	if err != nil {
		return nil, fmt.Errorf("start kubelet plugin services: %w", err)
	}
	p.health.Add("kubelet-registration", p.ownerOnly(watch.check(cfg.RegistrarSocket())))
	p.health.Add("dra-socket", p.ownerOnly(draSocketCheck(cfg.DRASocket())))
	return helper, nil
}

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
