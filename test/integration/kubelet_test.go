package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
)

const (
	driverName = contract.DefaultDriverName
	nodeName   = "node-1"
	nodeUID    = "9f0f3b6c-8a4e-4c43-9d35-1b8f9d2f6a01"
)

// node is one simulated node: its directories, API server (fake), GPUs and running plugin.
type node struct {
	t      testing.TB
	root   string
	cfg    plugin.Config
	kube   *fake.Clientset
	gpus   *gpu.Simulated
	plugin *plugin.Plugin
	bootID string
	// nri is the NRI runtime the plugin connects to (in this process), nil when NRI is off
	// or a test points NRISocket elsewhere.
	nri *nriRuntime
	// draListen, when set, creates the DRA socket's listener (plugin.Deps.DRAListen).
	draListen func(ctx context.Context, path string) (net.Listener, error)
	// claimGet, when set, runs before the fake API server answers a get of a ResourceClaim
	// (onClaimGet). The reactor is installed before the plugin starts: client-go's fake
	// clientset does not guard its reaction chain against a reactor added while in use.
	claimGet atomic.Pointer[func()]
}

// onClaimGet makes every later get of a ResourceClaim call hook first (nil: none).
func (n *node) onClaimGet(hook func()) {
	if hook == nil {
		n.claimGet.Store(nil)
		return
	}
	n.claimGet.Store(&hook)
}

// newNode lays out a node under a short temp dir (unix socket paths must stay under 100 bytes).
func newNode(t testing.TB, mutate ...func(*plugin.Config)) *node {
	t.Helper()
	root, err := os.MkdirTemp("/tmp", "vgi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	gpus, err := gpu.NewSimulated("dgx-h200", 2, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{
		t: t, root: root, gpus: gpus, bootID: "boot-1",
		kube: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: nodeUID}}),
		cfg: plugin.Config{
			NodeName: nodeName, DriverName: driverName,
			StateDir: filepath.Join(root, "state"), KubeletDir: filepath.Join(root, "kubelet"),
			CDIDir: filepath.Join(root, "cdi"), DeviceSource: "simulated:dgx-h200:2",
			GPUInjection: cdi.InjectionNone, ClaimFSBytes: 4 << 20,
			VGPU: true, NRI: true, HealthCheck: true,
		},
	}
	// Claims' tmpfs mounts a test (or a crash of it) leaves are detached before the temp dir
	// goes; registered first, so it runs after the plugin has stopped.
	n.kube.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		if hook := n.claimGet.Load(); hook != nil {
			(*hook)()
		}
		return false, nil, nil
	})
	t.Cleanup(func() {
		for _, m := range mountsUnder(t, root) {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	})
	n.cfg.NRISocket = filepath.Join(root, "nri.sock")
	for _, m := range mutate {
		m(&n.cfg)
	}
	if n.cfg.NRI && n.cfg.NRISocket == filepath.Join(root, "nri.sock") {
		n.nri = startNRIRuntime(t, n.cfg.NRISocket)
	}
	// The kubelet creates its plugin registration directory; the plugin only binds in it.
	if err := os.MkdirAll(filepath.Join(n.cfg.KubeletDir, "plugins_registry"), 0o750); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.stop)
	return n
}

// mountsUnder lists the mount points below dir, deepest first, from /proc/self/mountinfo.
func mountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	slices.Reverse(out)
	return out
}

// start runs the plugin; the kubelet side (registration) is separate, see register.
func (n *node) start() {
	n.t.Helper()
	if err := n.tryStart(); err != nil {
		n.t.Fatalf("start plugin: %v", err)
	}
}

func (n *node) tryStart() error {
	p, err := plugin.Start(context.Background(), n.cfg, plugin.Deps{KubeClient: n.kube, GPUs: n.gpus, BootID: n.bootID, DRAListen: n.draListen})
	if err != nil {
		return err
	}
	n.plugin = p
	return nil
}

func (n *node) stop() {
	if n.plugin != nil {
		n.plugin.Stop()
		n.plugin = nil
	}
}

func (n *node) restart() {
	n.t.Helper()
	n.stop()
	n.start()
}

// kubelet is the kubelet's side of the two protocols.
type kubelet struct {
	dra  drapb.DRAPluginClient
	conn *grpc.ClientConn
}

// register does what the kubelet's plugin watcher does: GetInfo on the registration socket,
// NotifyRegistrationStatus, then dial the endpoint GetInfo named.
func (n *node) register() *kubelet {
	n.t.Helper()
	return n.registerSocket(filepath.Join(n.cfg.KubeletDir, "plugins_registry", driverName+"-reg.sock"))
}

// registerPod registers the instance of pod podUID (its rolling-update registration socket).
func (n *node) registerPod(podUID string) *kubelet {
	n.t.Helper()
	return n.registerSocket(n.registrationSocket(podUID))
}

func (n *node) registerSocket(regSock string) *kubelet {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg := dial(n.t, regSock)
	defer reg.Close()
	rc := registerapi.NewRegistrationClient(reg)
	info, err := rc.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		n.t.Fatalf("GetInfo on %s: %v", regSock, err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != driverName {
		n.t.Fatalf("GetInfo = type %q name %q, want %q %q", info.Type, info.Name, registerapi.DRAPlugin, driverName)
	}
	if !contains(info.SupportedVersions, drapb.DRAPluginService) {
		n.t.Fatalf("plugin does not offer %s: %v", drapb.DRAPluginService, info.SupportedVersions)
	}
	if _, err := rc.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		n.t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
	conn := dial(n.t, info.Endpoint)
	n.t.Cleanup(func() { conn.Close() })
	return &kubelet{dra: drapb.NewDRAPluginClient(conn), conn: conn}
}

func dial(t testing.TB, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", socket, err)
	}
	return conn
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// prepare calls NodePrepareResources for the claims and fails the test on a gRPC error.
func (k *kubelet) prepare(t testing.TB, claims ...*resourceapi.ResourceClaim) map[string]*drapb.NodePrepareResourceResponse {
	t.Helper()
	resp, err := k.tryPrepare(claims...)
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	return resp
}

func (k *kubelet) tryPrepare(claims ...*resourceapi.ResourceClaim) (map[string]*drapb.NodePrepareResourceResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := k.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: draClaims(claims)})
	if err != nil {
		return nil, err
	}
	return resp.Claims, nil
}

// unprepare calls NodeUnprepareResources for the claims and fails the test on a gRPC error or
// a claim's error.
func (k *kubelet) unprepare(t testing.TB, claims ...*resourceapi.ResourceClaim) {
	t.Helper()
	resp, err := k.tryUnprepare(claims...)
	if err != nil {
		t.Fatalf("NodeUnprepareResources: %v", err)
	}
	for uid, r := range resp {
		if r.Error != "" {
			t.Errorf("unprepare claim %s: %s", uid, r.Error)
		}
	}
}

func (k *kubelet) tryUnprepare(claims ...*resourceapi.ResourceClaim) (map[string]*drapb.NodeUnprepareResourceResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := k.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: draClaims(claims)})
	if err != nil {
		return nil, err
	}
	return resp.Claims, nil
}

// draClaims names the claims as the kubelet does in its DRA calls.
func draClaims(claims []*resourceapi.ResourceClaim) []*drapb.Claim {
	out := make([]*drapb.Claim, 0, len(claims))
	for _, c := range claims {
		out = append(out, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	return out
}

// allocated is one allocation result of our driver.
type allocated struct {
	request, device string
	memory          string // e.g. "10Gi"; "" = unsized (whole GPU)
	cores           int64  // 0 = unsized
	shareID         string
	pool, driver    string // defaults: this node, our driver
	admin           bool   // a result of an adminAccess request
}

var claimSeq int

// newClaim creates an allocated claim reserved for one pod in the fake API server.
func (n *node) newClaim(name string, results ...allocated) *resourceapi.ResourceClaim {
	n.t.Helper()
	claimSeq++
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(fmt.Sprintf("0c1a1100-0000-4000-8000-%012d", claimSeq))},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name + "-pod", UID: types.UID(fmt.Sprintf("90d00000-0000-4000-8000-%012d", claimSeq))}},
		},
	}
	for _, r := range results {
		res := resourceapi.DeviceRequestAllocationResult{Request: r.request, Driver: driverName, Pool: nodeName, Device: r.device}
		if r.pool != "" {
			res.Pool = r.pool
		}
		if r.driver != "" {
			res.Driver = r.driver
		}
		if r.shareID != "" {
			share := types.UID(r.shareID)
			res.ShareID = &share
		}
		if r.admin {
			res.AdminAccess = &r.admin
		}
		if r.memory != "" || r.cores != 0 {
			res.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
		}
		if r.memory != "" {
			res.ConsumedCapacity[contract.CapacityMemory] = resource.MustParse(r.memory)
		}
		if r.cores != 0 {
			res.ConsumedCapacity[contract.CapacityCores] = *resource.NewQuantity(r.cores, resource.DecimalSI)
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, res)
	}
	created, err := n.kube.ResourceV1().ResourceClaims(c.Namespace).Create(context.Background(), c, metav1.CreateOptions{})
	if err != nil {
		n.t.Fatalf("create claim: %v", err)
	}
	return created
}

func dialTCP(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	return conn
}
