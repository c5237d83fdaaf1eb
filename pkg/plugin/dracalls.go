package plugin

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"

	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/handover"
	"github.com/vgpu-dra/vgpu-dra/pkg/instancelock"
)

// The kubelet's calls across a handover (contract §14). The kubelet sends each call to the newest
// registration of the driver that it is connected to: the old instance's until the new one has
// registered, and again the old one's if the new one's connection breaks. So every instance's
// helper must answer every call, and only the owner may prepare: the interceptor holds a call
// while a handover is decided, serves it here when this instance owns the node, and otherwise
// forwards it, as it came, to the owner's DRA socket.

// errNotOwner answers a call that reached the driver of an instance that does not own the node
// (the interceptor normally forwards it first).
var errNotOwner = errors.New("this plugin instance does not own the node (it is handing it over or has handed it over); the kubelet retries")

// draDelegate is the kubeletplugin.DRAPlugin the helper serves: the driver of the current
// ownership term.
type draDelegate struct {
	mu  sync.Mutex
	d   *driver.Driver
	ctx context.Context // the term's: health streams end with it
	// last is the latest term's driver, for errors the helper reports after a handover.
	last *driver.Driver
}

var _ kubeletplugin.DRAPlugin = &draDelegate{}

func (x *draDelegate) set(d *driver.Driver, ctx context.Context) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.d, x.ctx = d, ctx
	if d != nil {
		x.last = d
	}
}

func (x *draDelegate) current() (*driver.Driver, context.Context) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.d, x.ctx
}

func (x *draDelegate) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d, _ := x.current()
	if d == nil {
		if len(claims) == 0 {
			return map[types.UID]kubeletplugin.PrepareResult{}, nil
		}
		return nil, errNotOwner
	}
	return d.PrepareResourceClaims(ctx, claims)
}

func (x *draDelegate) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d, _ := x.current()
	if d == nil {
		if len(claims) == 0 {
			return map[types.UID]error{}, nil
		}
		return nil, errNotOwner
	}
	return d.UnprepareResourceClaims(ctx, claims)
}

func (x *draDelegate) HandleError(ctx context.Context, err error, msg string) {
	x.mu.Lock()
	d := x.last
	x.mu.Unlock()
	if d == nil {
		klog.FromContext(ctx).Error(err, msg)
		return
	}
	d.HandleError(ctx, err, msg)
}

// WatchHealthStatus streams the owner's device health; an instance that does not own the node
// ends the stream (the kubelet watches the new owner's).
func (x *draDelegate) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	d, termCtx := x.current()
	if d == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(termCtx, cancel)
	defer stop()
	return d.WatchHealthStatus(ctx, reports)
}

// gatedCall is a kubelet call that changes or relies on the node's prepared state, and how to
// receive the owner's answer when it is forwarded.
type gatedCall struct {
	newReply func() any
	claims   func(req any) int
}

var gatedCalls = map[string]gatedCall{
	drapbv1.DRAPlugin_NodePrepareResources_FullMethodName: {
		newReply: func() any { return &drapbv1.NodePrepareResourcesResponse{} },
		claims:   func(r any) int { return len(r.(*drapbv1.NodePrepareResourcesRequest).GetClaims()) },
	},
	drapbv1.DRAPlugin_NodeUnprepareResources_FullMethodName: {
		newReply: func() any { return &drapbv1.NodeUnprepareResourcesResponse{} },
		claims:   func(r any) int { return len(r.(*drapbv1.NodeUnprepareResourcesRequest).GetClaims()) },
	},
	drapbv1beta1.DRAPlugin_NodePrepareResources_FullMethodName: {
		newReply: func() any { return &drapbv1beta1.NodePrepareResourcesResponse{} },
		claims:   func(r any) int { return len(r.(*drapbv1beta1.NodePrepareResourcesRequest).GetClaims()) },
	},
	drapbv1beta1.DRAPlugin_NodeUnprepareResources_FullMethodName: {
		newReply: func() any { return &drapbv1beta1.NodeUnprepareResourcesResponse{} },
		claims:   func(r any) int { return len(r.(*drapbv1beta1.NodeUnprepareResourcesRequest).GetClaims()) },
	},
}

// forwardRetry is how long a call that could not reach the owner waits before it tries again
// (the owner died, and the lock decides who serves next).
const forwardRetry = 50 * time.Millisecond

// draInterceptor gates the kubelet's Prepare and Unprepare calls (contract §14). Calls without
// claims (the plugin's own DRA-socket probe) are not gated: they touch no state.
func (p *Plugin) draInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	call, ok := gatedCalls[info.FullMethod]
	if !ok || call.claims(req) == 0 {
		return handler(ctx, req)
	}
	p.kubeletCalls.Add(1)
	defer p.kubeletCalls.Add(-1)
	for {
		d, done, err := p.draGate.Enter(ctx)
		if err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		if d == handover.Local {
			defer done()
			return handler(ctx, req)
		}
		reply := call.newReply()
		err = p.forwarder.invoke(ctx, p.ownerDRASocket(), info.FullMethod, req, reply)
		if err == nil {
			return reply, nil
		}
		if status.Code(err) != codes.Unavailable {
			return nil, err
		}
		// The owner does not answer: it may have died. Whoever gets the lock serves.
		if p.tryOwn() {
			continue
		}
		select {
		case <-ctx.Done():
			return nil, status.Error(codes.Unavailable, "the node's vGPU plugin owner does not answer: "+err.Error())
		case <-time.After(forwardRetry):
		}
	}
}

// kubeletCallsWait bounds how long Stop waits for the kubelet's calls in flight before it stops
// the helper: stopping its gRPC server cuts them, and the kubelet retries a cut call only after
// a back-off.
const kubeletCallsWait = 5 * time.Second

// waitKubeletCalls waits, at most kubeletCallsWait, until no Prepare or Unprepare is in flight
// in this instance (served here or forwarded).
func (p *Plugin) waitKubeletCalls() {
	for end := time.Now().Add(kubeletCallsWait); p.kubeletCalls.Load() > 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
}

// ownerDRASocket is the DRA socket of the instance that holds the lock now, by the record it
// wrote ("" when it wrote none: it cannot be reached).
func (p *Plugin) ownerDRASocket() string {
	rec, ok := handover.ParseRecord(instancelock.ReadHolder(p.cfg.InstanceLockPath()).Record)
	if !ok || rec.PodUID == "" || rec.PodUID == p.cfg.PodUID {
		return ""
	}
	return p.cfg.draSocketOf(rec.PodUID)
}

// forwarder keeps one connection to the owner's DRA socket.
type forwarder struct {
	mu     sync.Mutex
	socket string
	conn   *grpc.ClientConn
}

func (f *forwarder) invoke(ctx context.Context, socket, method string, req, reply any) error {
	if socket == "" {
		return status.Error(codes.Unavailable, "no owner to forward to")
	}
	f.mu.Lock()
	if f.socket != socket || f.conn == nil {
		if f.conn != nil {
			_ = f.conn.Close()
		}
		conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			f.mu.Unlock()
			return status.Error(codes.Unavailable, err.Error())
		}
		f.socket, f.conn = socket, conn
	}
	conn := f.conn
	f.mu.Unlock()
	return conn.Invoke(ctx, method, req, reply)
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn != nil {
		_ = f.conn.Close()
		f.conn = nil
	}
}
