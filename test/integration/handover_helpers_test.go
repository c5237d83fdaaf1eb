package integration

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
)

// Pods of two plugin instances on one node (a rolling update's old and new pod).
const (
	podOld = "0a0a0a0a-0000-4000-8000-00000000000a"
	podNew = "0b0b0b0b-0000-4000-8000-00000000000b"
)

// startInstance runs one more plugin instance on the node, in this process, as the pod podUID:
// its own GPU source and probes, the node's directories, API server and NRI runtime. It stops
// at the end of the test (or when the test stops it).
func (n *node) startInstance(podUID string, mutate ...func(*plugin.Config, *plugin.Deps)) *plugin.Plugin {
	n.t.Helper()
	cfg := n.cfg
	cfg.PodUID, cfg.HealthAddress, cfg.MetricsAddress = podUID, "127.0.0.1:0", ""
	gpus, err := gpu.NewSimulated("dgx-h200", 2, nodeName)
	if err != nil {
		n.t.Fatal(err)
	}
	deps := plugin.Deps{KubeClient: n.kube, GPUs: gpus, BootID: n.bootID}
	for _, m := range mutate {
		m(&cfg, &deps)
	}
	p, err := plugin.Start(context.Background(), cfg, deps)
	if err != nil {
		n.t.Fatalf("start instance %s: %v", podUID, err)
	}
	n.t.Cleanup(p.Stop)
	return p
}

// readiness asks an instance's health server for the "readiness" service.
func readiness(t *testing.T, p *plugin.Plugin) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	c := dialTCP(t, p.HealthAddr().String())
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
	if err != nil {
		t.Fatalf("readiness Check: %v", err)
	}
	return resp.Status
}

// instanceMetric sums a metric's values (counters, gauges, histogram sample counts) of one
// instance, over the label pairs given.
func instanceMetric(t testing.TB, p *plugin.Plugin, name string, labels ...string) float64 {
	t.Helper()
	families, err := p.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !found {
					continue metric
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// eventually polls cond until it holds, failing the test after timeout (a bound against hangs,
// not a timing assertion).
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(timeout); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// rollingKubelet plays the kubelet's side of two instances of one driver (kubelet ≥ 1.33): it
// registers every registration socket of the driver that appears in plugins_registry, forgets
// those that go, and sends each call to one of the registered instances — chosen at random, a
// superset of the kubelet's "newest connected" (the DRA helper promises nothing about which
// instance gets a call, and every one must answer right).
type rollingKubelet struct {
	t    *testing.T
	n    *node
	mu   sync.Mutex
	regs map[string]*registeredPlugin // by registration socket
	stop chan struct{}
	done chan struct{}
}

type registeredPlugin struct {
	endpoint string
	conn     *grpc.ClientConn
	dra      drapb.DRAPluginClient
	// avoided: the kubelet no longer sends this instance calls (a newer one is connected);
	// inflight counts the calls it still has.
	avoided  bool
	inflight sync.WaitGroup
}

func startRollingKubelet(t *testing.T, n *node) *rollingKubelet {
	k := &rollingKubelet{t: t, n: n, regs: map[string]*registeredPlugin{}, stop: make(chan struct{}), done: make(chan struct{})}
	go k.watch()
	t.Cleanup(func() {
		close(k.stop)
		<-k.done
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, r := range k.regs {
			_ = r.conn.Close()
		}
	})
	return k
}

func (k *rollingKubelet) watch() {
	defer close(k.done)
	dir := filepath.Join(k.n.cfg.KubeletDir, "plugins_registry")
	for {
		socks, _ := filepath.Glob(filepath.Join(dir, driverName+"-*-reg.sock"))
		k.mu.Lock()
		for sock, r := range k.regs {
			if !slices.Contains(socks, sock) {
				_ = r.conn.Close()
				delete(k.regs, sock)
			}
		}
		k.mu.Unlock()
		for _, sock := range socks {
			k.mu.Lock()
			_, known := k.regs[sock]
			k.mu.Unlock()
			if !known {
				if r := k.register(sock); r != nil {
					k.mu.Lock()
					k.regs[sock] = r
					k.mu.Unlock()
				}
			}
		}
		select {
		case <-k.stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// register is the kubelet's plugin watcher: GetInfo, NotifyRegistrationStatus, dial the endpoint.
func (k *rollingKubelet) register(sock string) *registeredPlugin {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	reg := dial(k.t, sock)
	defer reg.Close()
	rc := registerapi.NewRegistrationClient(reg)
	info, err := rc.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return nil // not serving (yet, or any more)
	}
	if _, err := rc.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		return nil
	}
	conn := dial(k.t, info.Endpoint)
	return &registeredPlugin{endpoint: info.Endpoint, conn: conn, dra: drapb.NewDRAPluginClient(conn)}
}

// registered is the number of registered instances.
func (k *rollingKubelet) registered() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.regs)
}

// pick is a registered instance at random, counted in flight until done.
func (k *rollingKubelet) pick() (*registeredPlugin, func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var all []*registeredPlugin
	for _, r := range k.regs {
		if !r.avoided {
			all = append(all, r)
		}
	}
	if len(all) == 0 {
		return nil, func() {}
	}
	r := all[rand.IntN(len(all))]
	r.inflight.Add(1)
	return r, r.inflight.Done
}

// avoid makes the kubelet send the instance of podUID no more calls and waits for those it has:
// what the kubelet does once a newer registration of the driver is connected, long before the
// DaemonSet deletes the old pod (the new one must be Ready first).
func (k *rollingKubelet) avoid(n *node, podUID string) {
	sock := n.registrationSocket(podUID)
	k.mu.Lock()
	r := k.regs[sock]
	if r != nil {
		r.avoided = true
	}
	k.mu.Unlock()
	if r != nil {
		r.inflight.Wait()
	}
}

// call sends one request to an instance; a connection to an instance that has just gone
// (Unavailable, before the watch noticed its socket go) is retried on another, as the kubelet
// falls back to a connected registration.
func (k *rollingKubelet) call(do func(drapb.DRAPluginClient) error) error {
	for range 50 {
		r, done := k.pick()
		if r == nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		err := do(r.dra)
		done()
		if status.Code(err) == codes.Unavailable {
			if _, statErr := os.Stat(r.endpoint); statErr != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
		}
		return err
	}
	return status.Error(codes.Unavailable, "no registered instance answered")
}

func (k *rollingKubelet) prepare(c *resourceapi.ResourceClaim) (*drapb.NodePrepareResourceResponse, error) {
	var out *drapb.NodePrepareResourceResponse
	err := k.call(func(dra drapb.DRAPluginClient) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
		if err == nil {
			out = resp.Claims[string(c.UID)]
		}
		return err
	})
	return out, err
}

func (k *rollingKubelet) unprepare(c *resourceapi.ResourceClaim) (string, error) {
	var claimErr string
	err := k.call(func(dra drapb.DRAPluginClient) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
		if err == nil {
			claimErr = resp.Claims[string(c.UID)].GetError()
		}
		return err
	})
	return claimErr, err
}

// registrationSocket is the rolling-update registration socket of the instance in podUID.
func (n *node) registrationSocket(podUID string) string {
	dir := filepath.Join(n.cfg.KubeletDir, "plugins_registry")
	return filepath.Join(dir, kubeletplugin.RollingUpdateRegistrarSocketFile(dir, driverName, types.UID(podUID)))
}

// adjustedOnce checks that a CreateContainer's adjustment is exactly what one plugin gives a
// vGPU container: each of the three mounts once and the identity env. containerd's own result
// merging (the adaptation) already fails a container that two plugins adjust at one mount.
func adjustedOnce(adj *api.ContainerAdjustment) bool {
	dests := map[string]int{}
	for _, m := range adj.GetMounts() {
		dests[m.Destination]++
	}
	env := map[string]int{}
	for _, e := range adj.GetEnv() {
		env[e.Key]++
	}
	return len(adj.GetMounts()) == 3 && dests[contract.ContainerConfigDir] == 1 && dests[contract.ContainerVGPULockDir] == 1 &&
		dests[contract.ContainerVMemNodeDir] == 1 && env[contract.EnvPodUID] == 1 && env[contract.EnvContainerName] == 1
}
