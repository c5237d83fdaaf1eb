package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// dpDialTimeout bounds the fake kubelet's dial-back inside Register. The kubelet allows 10 s;
// a plugin that serves answers in milliseconds, one that does not never does.
const dpDialTimeout = 2 * time.Second

// dpKubelet plays the kubelet's device manager against a device plugin, the way the kubelet
// does it (pkg/kubelet/cm/devicemanager): a Registration server on <dir>/kubelet.sock whose
// Register dials back into the plugin's endpoint *inside the call* and asks
// GetDevicePluginOptions — so a plugin that registers before it serves is refused — and then
// reads ListAndWatch in the background; a second Register of a connected endpoint is refused
// ("already connected"), as the kubelet refuses it. restart does what a kubelet start does to
// the directory: every socket in it goes, kubelet.sock comes back new. It also serves the
// pod-resources API with the containers the test allocated through it.
type dpKubelet struct {
	t          testing.TB
	dir        string // <kubelet>/device-plugins
	podResSock string

	mu            sync.Mutex
	srv           *grpc.Server
	registrations []*pluginapi.RegisterRequest
	refused       []error
	connected     map[string]*grpc.ClientConn // endpoint → connection
	client        pluginapi.DevicePluginClient
	devices       []*pluginapi.Device // the last list received
	lists         int
	changed       chan struct{}
	held          []*podresourcesapi.PodResources
	podRes        *grpc.Server
}

// startDPKubelet serves kubelet.sock and pod-resources under kubeletDir.
func startDPKubelet(t testing.TB, kubeletDir string) *dpKubelet {
	t.Helper()
	k := &dpKubelet{t: t, dir: filepath.Join(kubeletDir, "device-plugins"), podResSock: filepath.Join(kubeletDir, "pod-resources", "kubelet.sock"),
		connected: map[string]*grpc.ClientConn{}, changed: make(chan struct{})}
	for _, d := range []string{k.dir, filepath.Dir(k.podResSock)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	k.serve()
	lis, err := net.Listen("unix", k.podResSock)
	if err != nil {
		t.Fatal(err)
	}
	podRes := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(podRes, dpPodResources{k: k})
	k.podRes = podRes
	go func() { _ = podRes.Serve(lis) }() // not k.podRes: stop clears it
	t.Cleanup(k.stop)
	return k
}

func (k *dpKubelet) serve() {
	lis, err := net.Listen("unix", filepath.Join(k.dir, "kubelet.sock"))
	if err != nil {
		k.t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, dpRegistration{k: k})
	go func() { _ = srv.Serve(lis) }()
	k.mu.Lock()
	k.srv = srv
	k.mu.Unlock()
}

// stop stops serving and drops every plugin connection, as a kubelet that exits.
func (k *dpKubelet) stop() {
	k.mu.Lock()
	srv, conns := k.srv, k.connected
	k.srv, k.connected, k.client = nil, map[string]*grpc.ClientConn{}, nil
	k.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	for _, c := range conns {
		_ = c.Close()
	}
	if k.podRes != nil {
		k.podRes.Stop()
		k.podRes = nil
	}
}

// acceptedNow is accepted, under the kubelet's lock.
func (k *dpKubelet) acceptedNow() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.accepted()
}

// restart is a kubelet restart: it exits, and the new one removes every socket in the
// directory (the plugin's too) before it listens on kubelet.sock again. With keepSockets the
// new kubelet leaves the plugin's socket alone and only kubelet.sock is new.
func (k *dpKubelet) restart(keepSockets bool) {
	k.mu.Lock()
	srv, conns := k.srv, k.connected
	k.srv, k.connected, k.client = nil, map[string]*grpc.ClientConn{}, nil
	k.mu.Unlock()
	srv.Stop()
	for _, c := range conns {
		_ = c.Close()
	}
	entries, err := os.ReadDir(k.dir)
	if err != nil {
		k.t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 && (!keepSockets || e.Name() == "kubelet.sock") {
			_ = os.Remove(filepath.Join(k.dir, e.Name()))
		}
	}
	k.serve()
}

type dpRegistration struct {
	pluginapi.UnimplementedRegistrationServer
	k *dpKubelet
}

// Register is the kubelet's: validate, dial back with a deadline, compare the options the
// plugin answers with the ones it registered, and follow its ListAndWatch.
func (r dpRegistration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k := r.k
	err := k.connect(ctx, req)
	k.mu.Lock()
	k.registrations = append(k.registrations, req)
	if err != nil {
		k.refused = append(k.refused, err)
	}
	k.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &pluginapi.Empty{}, nil
}

func (k *dpKubelet) connect(ctx context.Context, req *pluginapi.RegisterRequest) error {
	if req.Version != pluginapi.Version {
		return fmt.Errorf("unsupported version %q", req.Version)
	}
	k.mu.Lock()
	_, dup := k.connected[req.Endpoint]
	k.mu.Unlock()
	if dup {
		return fmt.Errorf("device plugin already connected: %s", req.Endpoint)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	client := pluginapi.NewDevicePluginClient(conn)
	dctx, cancel := context.WithTimeout(ctx, dpDialTimeout)
	defer cancel()
	opts, err := client.GetDevicePluginOptions(dctx, &pluginapi.Empty{})
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("failed to dial the device plugin back: %w", err)
	}
	if !proto.Equal(opts, req.Options) {
		_ = conn.Close()
		return fmt.Errorf("options registered %v differ from GetDevicePluginOptions %v", req.Options, opts)
	}
	stream, err := client.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		_ = conn.Close()
		return err
	}
	k.mu.Lock()
	k.connected[req.Endpoint], k.client = conn, client
	k.mu.Unlock()
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				k.mu.Lock()
				if k.connected[req.Endpoint] == conn {
					delete(k.connected, req.Endpoint)
				}
				k.mu.Unlock()
				_ = conn.Close()
				return
			}
			k.mu.Lock()
			k.devices, k.lists = resp.Devices, k.lists+1
			close(k.changed)
			k.changed = make(chan struct{})
			k.mu.Unlock()
		}
	}()
	return nil
}

// waitFor waits until cond holds on the kubelet's state (checked after every change and every
// 50 ms) or fails the test after timeout.
func (k *dpKubelet) waitFor(what string, timeout time.Duration, cond func(k *dpKubelet) bool) {
	k.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		k.mu.Lock()
		ok, changed := cond(k), k.changed
		k.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("timed out after %v waiting for the kubelet to see %s", timeout, what)
		}
		select {
		case <-changed:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// healthy counts the healthy devices of the last list (the node's allocatable).
func (k *dpKubelet) healthy() int {
	n := 0
	for _, d := range k.devices {
		if d.Health == pluginapi.Healthy {
			n++
		}
	}
	return n
}

// plugin is the connected plugin's client.
func (k *dpKubelet) plugin() pluginapi.DevicePluginClient {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.client == nil {
		k.t.Fatal("no device plugin connected")
	}
	return k.client
}

// allocate allocates ids to container app of pod ns/name through the plugin, and records it
// for pod-resources, as the kubelet does after Allocate answers.
func (k *dpKubelet) allocate(ns, name string, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	resp, err := k.plugin().Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.held = append(k.held, &podresourcesapi.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesapi.ContainerResources{{
		Name: "app", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: dpResource, DeviceIds: slices.Clone(ids)}},
	}}})
	k.mu.Unlock()
	return resp.ContainerResponses[0], nil
}

type dpPodResources struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	k *dpKubelet
}

func (p dpPodResources) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	return &podresourcesapi.ListPodResourcesResponse{PodResources: slices.Clone(p.k.held)}, nil
}
