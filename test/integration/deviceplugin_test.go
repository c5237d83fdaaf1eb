package integration

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/deviceplugin"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/instancelock"
)

const (
	dpResource = contract.DefaultResourceName
	// dpShares is the shares per GPU of a dpNode (2 simulated H200s).
	dpShares = 3
	// dpWait bounds what the fake kubelet waits for: events drive the plugin in milliseconds.
	dpWait = 20 * time.Second
)

// dpNode is a node in device-plugin mode: directories, fake API server, simulated GPUs, the
// fake kubelet (dpKubelet) and the real device plugin.
type dpNode struct {
	t       testing.TB
	root    string
	cfg     deviceplugin.Config
	kube    *fake.Clientset
	gpus    *gpu.Simulated
	kubelet *dpKubelet
	plugin  *deviceplugin.Plugin
}

func newDPNode(t testing.TB, mutate ...func(*deviceplugin.Config)) *dpNode {
	t.Helper()
	return newDPNodeGPUs(t, 2, mutate...)
}

// newDPNodeGPUs is newDPNode with that many simulated H200s (1–8).
func newDPNodeGPUs(t testing.TB, count int, mutate ...func(*deviceplugin.Config)) *dpNode {
	t.Helper()
	root, err := os.MkdirTemp("/tmp", "vgd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	gpus, err := gpu.NewSimulated("dgx-h200", count, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	n := &dpNode{t: t, root: root, gpus: gpus,
		kube: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}),
		cfg: deviceplugin.Config{
			NodeName: nodeName, DriverName: driverName, ResourceName: dpResource,
			StateDir: filepath.Join(root, "s"), KubeletDir: filepath.Join(root, "k"), CDIDir: filepath.Join(root, "c"),
			Sizing: deviceplugin.Sizing{SharesPerGPU: dpShares, ShareCores: 25}, Policy: deviceplugin.PolicyBinpack,
			ClaimFSBytes: 1 << 20, GPUInjection: cdi.InjectionNone, HealthCheck: true,
		},
	}
	// A stand-in for libvgpu.so: installed like the real one, so the CDI spec mounts it.
	n.cfg.LibrarySource = filepath.Join(root, "libvgpu.so")
	if err := os.WriteFile(n.cfg.LibrarySource, []byte("not really a library"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, m := range mutate {
		m(&n.cfg)
	}
	t.Cleanup(func() {
		for _, m := range mountsUnder(t, root) {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	})
	return n
}

func (n *dpNode) startKubelet() { n.kubelet = startDPKubelet(n.t, n.cfg.KubeletDir) }

func (n *dpNode) start() {
	n.t.Helper()
	p, err := deviceplugin.Start(context.Background(), n.cfg, deviceplugin.Deps{KubeClient: n.kube, GPUs: n.gpus})
	if err != nil {
		n.t.Fatalf("start the device plugin: %v", err)
	}
	n.plugin = p
	n.t.Cleanup(p.Stop)
}

// registrations is how many Register calls the kubelet accepted.
func (k *dpKubelet) accepted() int { return len(k.registrations) - len(k.refused) }

func (n *dpNode) waitAllocatable(want int) {
	n.t.Helper()
	n.kubelet.waitFor("allocatable "+strconv.Itoa(want), dpWait, func(k *dpKubelet) bool { return k.client != nil && k.healthy() == want })
}

// TestDevicePluginRegistersAfterServing: the plugin listens, serves, then registers — the fake
// kubelet dials back inside Register and would refuse a plugin that is not serving yet — with
// the options GetDevicePluginOptions answers; the kubelet then sees every share healthy, with
// its GPU's NUMA node, and liveness passes. A plugin started before the kubelet registers once
// kubelet.sock appears.
func TestDevicePluginRegistersAfterServing(t *testing.T) {
	for _, kubeletFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "kubelet first", false: "plugin first"}[kubeletFirst], func(t *testing.T) {
			n := newDPNode(t)
			if kubeletFirst {
				n.startKubelet()
				n.start()
			} else {
				n.start()
				n.startKubelet()
			}
			n.waitAllocatable(2 * dpShares)
			k := n.kubelet
			k.mu.Lock()
			regs, refused, devices := k.registrations, k.refused, k.devices
			k.mu.Unlock()
			if len(refused) != 0 || len(regs) != 1 {
				t.Fatalf("registrations %v, refused %v; want one, accepted", regs, refused)
			}
			r := regs[0]
			if r.Version != pluginapi.Version || r.ResourceName != dpResource || r.Endpoint != filepath.Base(n.cfg.Socket()) ||
				r.Options == nil || !r.Options.GetPreferredAllocationAvailable || r.Options.PreStartRequired {
				t.Errorf("RegisterRequest %+v", r)
			}
			for _, d := range devices {
				if d.Topology == nil || len(d.Topology.Nodes) != 1 {
					t.Errorf("device %s without its NUMA node", d.ID)
				}
			}
			waitHealthy(t, n.plugin)
		})
	}
}

// waitHealthy waits for the plugin's liveness checks to pass (the kubelet opens ListAndWatch
// just after Register returns).
func waitHealthy(t testing.TB, p *deviceplugin.Plugin) {
	t.Helper()
	deadline := time.Now().Add(dpWait)
	for {
		err := p.Health(context.Background())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("liveness: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDevicePluginSurvivesKubeletRestart: a kubelet restart removes the plugin's socket and
// re-creates kubelet.sock; the plugin serves anew and registers again, and the new kubelet's
// allocatable is back to every share (the known failure of other GPU plugins: it stays 0).
// kubelet.sock re-created alone, too, is a new kubelet to register with.
func TestDevicePluginSurvivesKubeletRestart(t *testing.T) {
	n := newDPNode(t)
	n.startKubelet()
	n.start()
	n.waitAllocatable(2 * dpShares)
	// Each restart must bring a new registration, on both sides. Counted as "more than before",
	// not as exact totals: a Register whose answer is lost (EOF while the kubelet goes away)
	// is accepted by the kubelet, not counted by the plugin, and tried again.
	restart := func(what string, keepSockets bool) {
		t.Helper()
		kubeletBefore, pluginBefore := n.kubelet.acceptedNow(), n.plugin.Debug().Registrations
		n.kubelet.restart(keepSockets)
		n.kubelet.waitFor(what, dpWait, func(k *dpKubelet) bool { return k.accepted() > kubeletBefore })
		n.waitAllocatable(2 * dpShares)
		n.waitPluginRegistrationsAbove(pluginBefore)
	}
	for round := 2; round <= 4; round++ {
		restart("registration "+strconv.Itoa(round), false)
	}
	// Only kubelet.sock is new; the plugin's own socket stays.
	restart("registration with the new kubelet.sock", true)
	waitHealthy(t, n.plugin)
	if _, err := n.kubelet.allocate("ns", "after-restart", deviceplugin.ShareID(n.gpuUUID(0), 0)); err != nil {
		t.Errorf("Allocate after the restarts: %v", err)
	}
}

// waitPluginRegistrationsAbove waits until the plugin has counted more registrations than
// before.
func (n *dpNode) waitPluginRegistrationsAbove(before int64) {
	n.t.Helper()
	deadline := time.Now().Add(dpWait)
	for n.plugin.Debug().Registrations <= before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := n.plugin.Debug().Registrations; got <= before {
		n.t.Errorf("debug state counts %d registrations, no more than the %d before the kubelet restarted", got, before)
	}
}

// waitPluginRegistrations waits until the plugin has counted want registrations (it records one
// once the kubelet's answer to its call has arrived).
func (n *dpNode) waitPluginRegistrations(want int64) {
	n.t.Helper()
	deadline := time.Now().Add(dpWait)
	for n.plugin.Debug().Registrations < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := n.plugin.Debug().Registrations; got != want {
		n.t.Errorf("debug state counts %d registrations, want %d", got, want)
	}
}

func (n *dpNode) gpuUUID(i int) string {
	devs, err := n.gpus.Devices(context.Background())
	if err != nil {
		n.t.Fatal(err)
	}
	return devs[i].UUID
}

// TestDevicePluginOwnSocketRemoved: removing the plugin's socket (by hand, or a kubelet that
// cleans its directory) makes the plugin serve on a new one and register it; the kubelet's old
// connection ends, the new one answers.
func TestDevicePluginOwnSocketRemoved(t *testing.T) {
	n := newDPNode(t)
	n.startKubelet()
	n.start()
	n.waitAllocatable(2 * dpShares)
	if err := os.Remove(n.cfg.Socket()); err != nil {
		t.Fatal(err)
	}
	// The kubelet refuses a second registration while the old stream is open: the plugin's
	// retry gets through once the old server has stopped.
	n.kubelet.waitFor("a second registration", dpWait, func(k *dpKubelet) bool { return k.accepted() == 2 })
	if _, err := os.Stat(n.cfg.Socket()); err != nil {
		t.Fatalf("no socket after the re-registration: %v", err)
	}
	n.waitAllocatable(2 * dpShares)
	if _, err := n.kubelet.allocate("ns", "a", deviceplugin.ShareID(n.gpuUUID(1), 2)); err != nil {
		t.Errorf("Allocate through the new socket: %v", err)
	}
	waitHealthy(t, n.plugin)
}

// TestDevicePluginListAndWatchEveryStream: two ListAndWatch streams (the kubelet's and another)
// both see a GPU's shares go unhealthy on an NVML health event, and come back on recovery.
func TestDevicePluginListAndWatchEveryStream(t *testing.T) {
	n := newDPNode(t)
	n.startKubelet()
	n.start()
	n.waitAllocatable(2 * dpShares)
	conn := dial(t, n.cfg.Socket())
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	second, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	secondHealthy := func(want int) {
		t.Helper()
		for {
			resp, err := second.Recv()
			if err != nil {
				t.Fatalf("second stream: %v", err)
			}
			healthy := 0
			for _, d := range resp.Devices {
				if d.Health == pluginapi.Healthy {
					healthy++
				}
			}
			if healthy == want {
				return
			}
		}
	}
	secondHealthy(2 * dpShares)
	if err := n.gpus.SetHealth(n.gpuUUID(1), false, 79); err != nil {
		t.Fatal(err)
	}
	n.waitAllocatable(dpShares)
	secondHealthy(dpShares)
	if _, err := n.kubelet.allocate("ns", "a", deviceplugin.ShareID(n.gpuUUID(1), 0)); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), n.gpuUUID(1)+"::0") {
		t.Errorf("Allocate of an unhealthy share: %v, want FailedPrecondition naming it", err)
	}
	if err := n.gpus.SetHealth(n.gpuUUID(1), true, 0); err != nil {
		t.Fatal(err)
	}
	n.waitAllocatable(2 * dpShares)
	secondHealthy(2 * dpShares)
}

// TestDevicePluginAllocate: Allocate through the kubelet's connection answers the lead share's
// CDI device, which the runtime's CDI cache resolves from the spec written at start-up into
// the share's mounts; the share's vgpu.config holds the merged limits. IDs that are not this
// node's, or repeated, are refused with InvalidArgument naming them; GetPreferredAllocation
// answers binpack.
func TestDevicePluginAllocate(t *testing.T) {
	n := newDPNode(t)
	n.startKubelet()
	n.start()
	n.waitAllocatable(2 * dpShares)
	g0, g1 := n.gpuUUID(0), n.gpuUUID(1)
	resp, err := n.kubelet.allocate("ns", "a", deviceplugin.ShareID(g0, 2), deviceplugin.ShareID(g0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.CdiDevices) != 1 || resp.CdiDevices[0].Name != driverName+"/share="+g0+"::1" {
		t.Fatalf("CDI devices %v, want the lead share's", resp.CdiDevices)
	}
	if resp.Envs["CUDA_CORE_LIMIT_0"] != "50" || resp.Envs["MANAGER_VISIBLE_DEVICE_0"] != g0 {
		t.Errorf("env: cores %q, GPU %q; want the two shares merged", resp.Envs["CUDA_CORE_LIMIT_0"], resp.Envs["MANAGER_VISIBLE_DEVICE_0"])
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(n.cfg.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	dev := cache.GetDevice(resp.CdiDevices[0].Name)
	if dev == nil {
		t.Fatalf("the runtime cannot resolve %s", resp.CdiDevices[0].Name)
	}
	var config string
	for _, m := range dev.ContainerEdits.Mounts {
		if m.ContainerPath == contract.ContainerConfigDir {
			config = m.HostPath
		}
	}
	data, err := os.ReadFile(filepath.Join(config, contract.ContainerConfigName))
	if err != nil {
		t.Fatalf("the mounted config dir holds no vgpu.config: %v", err)
	}
	cfg, err := contract.ParseContainerConfig(data)
	if err != nil || len(cfg.GPUs) != 1 || cfg.GPUs[0].Cores != 50 || cfg.RegisterUUID != resp.Envs["MANAGER_CLIENT_REGISTER_UUID"] {
		t.Errorf("vgpu.config %+v (%v), env register UUID %q", cfg, err, resp.Envs["MANAGER_CLIENT_REGISTER_UUID"])
	}
	for _, bad := range [][]string{{"GPU-unknown::0"}, {g1 + "::" + strconv.Itoa(dpShares)}, {g1 + "::0", g1 + "::0"}, {}} {
		_, err := n.kubelet.allocate("ns", "bad", bad...)
		if status.Code(err) != codes.InvalidArgument || (len(bad) > 0 && !strings.Contains(err.Error(), bad[0])) {
			t.Errorf("Allocate %v: %v, want InvalidArgument naming it", bad, err)
		}
	}
	pref, err := n.kubelet.plugin().GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: []string{g1 + "::0", g1 + "::1", g1 + "::2", g0 + "::0"}, AllocationSize: 1,
		}}})
	if err != nil || len(pref.ContainerResponses) != 1 || strings.Join(pref.ContainerResponses[0].DeviceIDs, ",") != g0+"::0" {
		t.Errorf("GetPreferredAllocation = %v, %v; want the fullest GPU's share %s::0", pref, err, g0)
	}
}

// TestDevicePluginOnePluginPerNode: the device plugin takes the kubelet plugin's instance lock,
// so the two never serve one node together: while another holds it, Start waits.
func TestDevicePluginOnePluginPerNode(t *testing.T) {
	n := newDPNode(t)
	lock, err := instancelock.Acquire(context.Background(), n.cfg.InstanceLockPath())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Release() }()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if p, err := deviceplugin.Start(ctx, n.cfg, deviceplugin.Deps{KubeClient: n.kube, GPUs: n.gpus}); err == nil {
		p.Stop()
		t.Fatal("started while the kubelet plugin's lock is held")
	}
	if _, err := os.Stat(n.cfg.Socket()); !os.IsNotExist(err) {
		t.Errorf("the waiting plugin created its socket: %v", err)
	}
}

// TestDevicePluginDebugEndpoint: the debug socket shows the shares and the registration, and
// injects health events into simulated GPUs through NVML's event path (how the e2e suite and
// the demo make a GPU fail and recover on a real cluster).
func TestDevicePluginDebugEndpoint(t *testing.T) {
	n := newDPNode(t)
	n.startKubelet()
	n.start()
	n.waitAllocatable(2 * dpShares)
	// The kubelet opens ListAndWatch before its answer to Register reaches the plugin: the
	// shares can be allocatable a moment before the plugin counts itself registered.
	n.waitPluginRegistrations(1)
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", n.cfg.DebugSocketPath())
	}}}
	resp, err := client.Get("http://debug/")
	if err != nil {
		t.Fatal(err)
	}
	var st deviceplugin.DebugState
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || !st.Registered || len(st.Shares) != 2*dpShares || st.Resource != dpResource {
		t.Fatalf("GET / = %+v, %v", st, err)
	}
	post := func(query string) int {
		t.Helper()
		resp, err := client.Post("http://debug/health?"+query, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("gpu=" + n.gpuUUID(0) + "&healthy=false&xid=79"); code != http.StatusNoContent {
		t.Fatalf("inject a fault: %d", code)
	}
	n.waitAllocatable(dpShares)
	if code := post("gpu=" + n.gpuUUID(0) + "&healthy=true"); code != http.StatusNoContent {
		t.Fatalf("inject the recovery: %d", code)
	}
	n.waitAllocatable(2 * dpShares)
	for _, bad := range []string{"gpu=GPU-none&healthy=false&xid=79", "gpu=" + n.gpuUUID(0) + "&healthy=maybe", "gpu=" + n.gpuUUID(0) + "&healthy=false"} {
		if code := post(bad); code != http.StatusBadRequest {
			t.Errorf("POST /health?%s: %d, want 400", bad, code)
		}
	}
	if st, err := os.Stat(n.cfg.DebugSocketPath()); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("debug socket mode: %v, %v", st, err)
	}
}

// TestDevicePluginFailedStartReleasesEverything: a start-up that fails — early (GPUs too small
// for the shares asked), at the socket (its path taken by a directory), or late (the health port
// cannot be bound, after the plugin served and registered) — returns the error without hanging,
// leaves no socket of its own behind and releases the instance lock.
func TestDevicePluginFailedStartReleasesEverything(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mutate  func(*deviceplugin.Config)
		prepare func(n *dpNode)
	}{
		{"shares do not fit", func(c *deviceplugin.Config) { c.Sizing.ShareMemory = 100 << 30 }, nil},
		{"socket path taken", func(*deviceplugin.Config) {}, func(n *dpNode) {
			if err := os.MkdirAll(filepath.Join(n.cfg.Socket(), "x"), 0o755); err != nil {
				t.Fatal(err)
			}
		}},
		{"health port refused", func(c *deviceplugin.Config) { c.HealthAddress = "256.0.0.1:1" }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newDPNode(t, tc.mutate)
			n.startKubelet()
			if tc.prepare != nil {
				tc.prepare(n)
			}
			if p, err := deviceplugin.Start(context.Background(), n.cfg, deviceplugin.Deps{KubeClient: n.kube, GPUs: n.gpus}); err == nil {
				p.Stop()
				t.Fatal("started")
			}
			if st, err := os.Stat(n.cfg.Socket()); err == nil && st.Mode()&os.ModeSocket != 0 {
				t.Error("plugin socket left after the failed start")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			lock, err := instancelock.Acquire(ctx, n.cfg.InstanceLockPath())
			if err != nil {
				t.Fatalf("the instance lock is still held: %v", err)
			}
			_ = lock.Release()
		})
	}
}
