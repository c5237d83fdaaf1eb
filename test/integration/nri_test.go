package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
)

const (
	shareN1 = "5a4e1001-0000-4000-8000-000000000000"
	shareN2 = "5a4e1002-0000-4000-8000-000000000000"
)

// metricValue sums the samples of an unlabelled counter or gauge, as a scrape shows them.
func metricValue(t *testing.T, n *node, name string) float64 {
	t.Helper()
	families, err := n.plugin.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// podOf is the sandbox of the pod a claim from newClaim is reserved for.
func podOf(c *resourceapi.ResourceClaim) *api.PodSandbox {
	ref := c.Status.ReservedFor[0]
	return &api.PodSandbox{Id: "sandbox-" + string(ref.UID)[:8] + string(ref.UID)[30:], Uid: string(ref.UID), Namespace: c.Namespace, Name: ref.Name}
}

// vgpuContainer is a container of a prepared claim as containerd hands it to NRI: the env that
// the claim's CDI devices (read from the spec on disk) left, over an image env that tries to
// carry values of its own, and the CDI devices containerd ≥ 2.3 reports.
func (n *node) vgpuContainer(id, name string, resp *drapb.NodePrepareResourceResponse, claimUID string) *api.Container {
	n.t.Helper()
	spec := n.readSpec(claimUID)
	env := map[string]string{"PATH": "/usr/local/bin:/usr/bin", contract.EnvMemLimitPfx + "0": "999999m", contract.EnvClaimUID: "forged-by-image"}
	var devices []string
	for _, d := range resp.Devices {
		for _, id := range d.CdiDeviceIds {
			if slices.Contains(devices, id) {
				continue
			}
			devices = append(devices, id)
			_, dev, _ := strings.Cut(id, "=")
			for k, v := range spec.env(n.t, dev) {
				env[k] = v
			}
		}
	}
	ctr := &api.Container{Id: id, Name: name}
	for k, v := range env {
		ctr.Env = append(ctr.Env, k+"="+v)
	}
	slices.Sort(ctr.Env)
	for _, d := range devices {
		ctr.CDIDevices = append(ctr.CDIDevices, &api.CDIDevice{Name: d})
	}
	return ctr
}

// waitSession waits until the plugin has had at least sessions NRI sessions and is synced.
func (n *node) waitSession(sessions int) nri.Status {
	n.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := n.plugin.NRI().Status()
		if st.Sessions >= sessions && st.Synced {
			return st
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("no NRI session %d: %+v", sessions, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mountsOf(adj *api.ContainerAdjustment) map[string]*api.Mount {
	out := map[string]*api.Mount{}
	for _, m := range adj.GetMounts() {
		out[m.Destination] = m
	}
	return out
}

// TestNRICreateContainer: the whole NRI path through containerd's own runtime side — Prepare
// over the kubelet protocol, CreateContainer with the env CDI left, the adjustment, the
// directories, the cache with PID and cgroup, the debug endpoint, removal.
func TestNRICreateContainer(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "4Gi", cores: 30, shareID: shareN1})
	resp := k.prepare(t, a)[string(a.UID)]
	if got := n.readCheckpoint().Claims[string(a.UID)].Path; got != contract.PathNRI {
		t.Fatalf("claim path %q, want nri", got)
	}
	n.waitSession(1)
	ctx := t.Context()
	pod := podOf(a)
	if err := n.nri.runPod(ctx, pod); err != nil {
		t.Fatal(err)
	}

	// A container without vGPU env is untouched.
	adj, err := n.nri.create(ctx, pod.Id, &api.Container{Id: "sidecar", Name: "sidecar", Env: []string{"PATH=/bin"}})
	if err != nil || len(adj.GetMounts()) != 0 || len(adj.GetEnv()) != 0 {
		t.Fatalf("sidecar: %v %v", adj, err)
	}

	adj, err = n.nri.create(ctx, pod.Id, n.vgpuContainer("ctr-1", "app", resp, string(a.UID)))
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	dir := filepath.Join(n.claimDir(string(a.UID)), pod.Uid+"_app")
	m := mountsOf(adj)
	for dest, want := range map[string]string{contract.ContainerConfigDir: "config", contract.ContainerVGPULockDir: "vgpu_lock", contract.ContainerVMemNodeDir: "vmem_node"} {
		got, ok := m[dest]
		if !ok || got.Source != filepath.Join(dir, want) || !exists(got.Source) {
			t.Errorf("mount %s: %v, want %s/%s existing", dest, got, dir, want)
		}
	}
	if !slices.Contains(m[contract.ContainerConfigDir].GetOptions(), "ro") {
		t.Error("config dir is not read-only")
	}
	env := map[string]string{}
	for _, e := range adj.GetEnv() {
		env[e.Key] = e.Value
	}
	if env[contract.EnvPodUID] != pod.Uid || env[contract.EnvContainerName] != "app" {
		t.Errorf("identity env %v", env)
	}

	if err := n.nri.start(ctx, "ctr-1", uint32(os.Getpid())); err != nil {
		t.Fatal(err)
	}
	in, ok := n.plugin.NRICache().Lookup(pod.Uid, "app")
	if !ok || in.ContainerID != "ctr-1" || in.PID != os.Getpid() || in.Cgroup.Unified == "" && in.Cgroup.PIDsV1 == "" || in.ConfigDir != filepath.Join(dir, "config") {
		t.Errorf("cache instance %+v", in)
	}
	if got := metricValue(t, n, "vgpu_dra_nri_injections_total"); got != 1 {
		t.Errorf("injections %v, want 1", got)
	}

	// The debug endpoint, as curl --unix-socket reads it.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", n.cfg.DebugSocketPath())
	}}}
	r, err := hc.Get("http://localhost/")
	if err != nil {
		t.Fatal(err)
	}
	var dbg nri.DebugState
	err = json.NewDecoder(r.Body).Decode(&dbg)
	r.Body.Close()
	if err != nil || !dbg.NRI.Connected || !dbg.CacheSynced || len(dbg.Cache) != 1 || len(dbg.Claims) != 1 || dbg.Claims[0].Path != contract.PathNRI {
		t.Errorf("debug state %+v (%v)", dbg, err)
	}

	if err := n.nri.stop(ctx, "ctr-1"); err != nil {
		t.Fatal(err)
	}
	if err := n.nri.remove(ctx, "ctr-1"); err != nil {
		t.Fatal(err)
	}
	if exists(dir) || n.plugin.NRICache().Len() != 0 {
		t.Error("RemoveContainer left the directory or the entry")
	}
	// A forged claim UID: created without vGPU directories, counted.
	forged := &api.Container{Id: "forged", Name: "evil", Env: []string{contract.EnvClaimUID + "=0c1a1100-0000-4000-8000-999999999999"}}
	if adj, err := n.nri.create(ctx, pod.Id, forged); err != nil || len(adj.GetMounts()) != 0 {
		t.Errorf("forged: %v %v", adj, err)
	}
	if got := counterValue(t, n, "vgpu_dra_nri_rejections_total", "reason", contract.RejectClaimNotPrepared); got != 1 {
		t.Errorf("rejections{claim_not_prepared} = %v", got)
	}
}

// TestNRIRuntimeRestart: the runtime (in a child process, as containerd is) is SIGKILLed with
// containers known and started again; the plugin reconnects and Synchronize rebuilds exactly
// the cache it had, PIDs and cgroups included.
func TestNRIRuntimeRestart(t *testing.T) {
	dir := shortDir(t)
	socket, state := filepath.Join(dir, "nri.sock"), filepath.Join(dir, "state.json")
	rt := startRuntimeProc(t, socket, state, 2*time.Second)
	n := newNode(t, func(c *plugin.Config) { c.NRISocket = socket })
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "4Gi", cores: 30, shareID: shareN1})
	b := n.newClaim("b", allocated{request: "gpu", device: "gpu-1", memory: "4Gi", cores: 30, shareID: shareN2})
	resp := k.prepare(t, a, b)
	n.waitSession(1)
	for i, c := range []*resourceapi.ResourceClaim{a, b} {
		pod := podOf(c)
		if ans := rt.do(runtimeCmd{Op: "pod", Pod: pod}); ans.Err != "" {
			t.Fatal(ans.Err)
		}
		id := fmt.Sprintf("ctr-%d", i)
		if ans := rt.do(runtimeCmd{Op: "create", PodID: pod.Id, Ctr: n.vgpuContainer(id, "app", resp[string(c.UID)], string(c.UID))}); ans.Err != "" || len(ans.Adjust.GetMounts()) != 3 {
			t.Fatalf("create %s: %+v", id, ans)
		}
	}
	if ans := rt.do(runtimeCmd{Op: "start", ID: "ctr-0", PID: uint32(os.Getpid())}); ans.Err != "" {
		t.Fatal(ans.Err)
	}
	before := n.plugin.NRICache().List()
	if len(before) != 2 || before[0].PID == 0 && before[1].PID == 0 {
		t.Fatalf("cache before the restart: %+v", before)
	}

	rt.kill()
	rt = startRuntimeProc(t, socket, state, 2*time.Second)
	st := n.waitSession(2)
	after := n.plugin.NRICache().List()
	if !slices.EqualFunc(before, after, func(x, y nri.Instance) bool {
		return fmt.Sprintf("%+v", x) == fmt.Sprintf("%+v", y)
	}) {
		t.Errorf("cache after the restart differs:\nbefore %+v\nafter  %+v", before, after)
	}
	if got := metricValue(t, n, "vgpu_dra_nri_reconnects_total"); got < 1 || st.Attempts < 2 {
		t.Errorf("reconnects %v, status %+v", got, st)
	}
	// The reconnected plugin still serves: a container removed after the restart goes.
	if ans := rt.do(runtimeCmd{Op: "remove", ID: "ctr-1"}); ans.Err != "" {
		t.Fatal(ans.Err)
	}
	if _, ok := n.plugin.NRICache().Get("ctr-1"); ok || exists(filepath.Join(n.claimDir(string(b.UID)), podOf(b).Uid+"_app")) {
		t.Error("RemoveContainer after the restart left state")
	}
}

// TestNRITimeoutRollsBack: a CreateContainer that overruns the runtime's request timeout (here
// the API read on a reservedFor miss is slow) leaves no directory and no entry behind; the
// runtime fails the request (FailRequest policy) and the plugin reconnects.
func TestNRITimeoutRollsBack(t *testing.T) {
	adaptation.SetPluginRequestTimeout(300 * time.Millisecond)
	t.Cleanup(func() { adaptation.SetPluginRequestTimeout(2 * time.Second) })
	n := newNode(t)
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "4Gi", cores: 30, shareID: shareN1})
	resp := k.prepare(t, a)[string(a.UID)]
	n.waitSession(1)

	// A second pod starts to share the claim; the kubelet does not prepare it again, so the
	// plugin reads the claim, and the API server is slow.
	second := &api.PodSandbox{Id: "sandbox-second", Uid: "90d00000-0000-4000-8000-0000000000ff", Namespace: "default", Name: "second"}
	a.Status.ReservedFor = append(a.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: second.Name, UID: types.UID(second.Uid)})
	if _, err := n.kube.ResourceV1().ResourceClaims(a.Namespace).UpdateStatus(t.Context(), a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	var once sync.Once
	n.onClaimGet(func() {
		time.Sleep(450 * time.Millisecond)
		once.Do(func() { close(released) })
	})
	ctx := t.Context()
	if err := n.nri.runPod(ctx, second); err != nil {
		t.Fatal(err)
	}
	_, err := n.nri.create(ctx, second.Id, n.vgpuContainer("late", "app", resp, string(a.UID)))
	if err == nil {
		t.Error("the runtime did not fail a request the plugin did not answer in time (FailRequest)")
	}
	<-released
	dir := filepath.Join(n.claimDir(string(a.UID)), second.Uid+"_app")
	deadline := time.Now().Add(10 * time.Second)
	for exists(dir) || n.plugin.NRICache().Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after the timeout: dir exists %v, cache %+v", exists(dir), n.plugin.NRICache().List())
		}
		time.Sleep(10 * time.Millisecond)
	}
	n.waitSession(2) // dropped by the runtime, reconnected
}

// TestNRISecondPluginProcessWaits: a second plugin process on the node that cannot hand over
// (no pod UID, as before contract §14) starts, but owns nothing and never registers with NRI
// while the first lives; it takes over when the first ends.
func TestNRISecondPluginProcessWaits(t *testing.T) {
	n := newNode(t)
	n.start()
	n.waitSession(1)
	regs := n.nri.registrations()
	cfg := n.cfg
	cfg.HealthAddress, cfg.MetricsAddress, cfg.DebugSocket = "", "", "-"
	b, _ := json.Marshal(cfg)
	second := startChild(t, "plugin", "VGPU_PLUGIN_CONFIG="+string(b))
	if s := second.line(30 * time.Second); s != "started" {
		t.Fatalf("second plugin process: %q, want started", s)
	}
	lines := make(chan string, 1)
	go func() {
		for {
			s, err := second.out.ReadString('\n')
			if s = strings.TrimSpace(s); !strings.HasPrefix(s, "step ") || err != nil {
				lines <- s
				return
			}
		}
	}()
	select {
	case s := <-lines:
		t.Fatalf("second plugin process said %q while the first lives", s)
	case <-time.After(3 * time.Second):
	}
	if got := n.nri.registrations(); got != regs {
		t.Fatalf("NRI registrations %d → %d while the first plugin lives", regs, got)
	}
	n.stop()
	select {
	case s := <-lines:
		if s != "owner" {
			t.Fatalf("second plugin process: %q, want owner", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("second plugin process did not take over")
	}
	deadline := time.Now().Add(30 * time.Second)
	for n.nri.registrations() == regs {
		if time.Now().After(deadline) {
			t.Fatal("second plugin process never registered with NRI")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNRIHealthAfterGrace: with the runtime gone longer than the grace period after a good
// session, liveness is NOT_SERVING; it is SERVING again once the runtime is back.
func TestNRIHealthAfterGrace(t *testing.T) {
	dir := shortDir(t)
	socket, state := filepath.Join(dir, "nri.sock"), filepath.Join(dir, "state.json")
	rt := startRuntimeProc(t, socket, state, 2*time.Second)
	n := newNode(t, func(c *plugin.Config) {
		c.NRISocket, c.NRIFailureGrace, c.HealthAddress = socket, 500*time.Millisecond, "127.0.0.1:0"
	})
	n.start()
	n.register()
	n.waitSession(1)
	if got := probe(t, n); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("connected: %v", got)
	}
	rt.kill()
	time.Sleep(200 * time.Millisecond)
	if got := probe(t, n); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("within the grace period: %v, want SERVING", got)
	}
	time.Sleep(time.Second)
	if got := probe(t, n); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("after the grace period: %v, want NOT_SERVING", got)
	}
	// What the alert compares (contract §8): lost for longer than the grace.
	lost, grace := metricValue(t, n, "vgpu_dra_nri_lost_seconds"), metricValue(t, n, "vgpu_dra_nri_failure_grace_seconds")
	if grace != 0.5 || lost <= grace {
		t.Errorf("after the grace period: nri_lost_seconds %v, nri_failure_grace_seconds %v; want lost > grace = 0.5", lost, grace)
	}
	startRuntimeProc(t, socket, state, 2*time.Second)
	n.waitSession(2)
	if got := probe(t, n); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("runtime back: %v, want SERVING", got)
	}
	if lost := metricValue(t, n, "vgpu_dra_nri_lost_seconds"); lost != 0 {
		t.Errorf("runtime back: nri_lost_seconds %v, want 0", lost)
	}
}

// TestNRINeverOfferedIsNoFault: a node whose runtime has no NRI socket prepares claims on the
// per-claim path and stays healthy.
func TestNRINeverOfferedIsNoFault(t *testing.T) {
	n := newNode(t, func(c *plugin.Config) {
		c.NRISocket, c.NRIFailureGrace, c.HealthAddress = filepath.Join(filepath.Dir(c.StateDir), "none.sock"), 100*time.Millisecond, "127.0.0.1:0"
	})
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "4Gi", cores: 30, shareID: shareN1})
	if r := k.prepare(t, a)[string(a.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if got := n.readCheckpoint().Claims[string(a.UID)].Path; got != contract.PathPerClaim {
		t.Errorf("claim path %q, want per-claim", got)
	}
	time.Sleep(300 * time.Millisecond)
	if got := probe(t, n); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("no NRI at all: %v, want SERVING", got)
	}
	if lost := metricValue(t, n, "vgpu_dra_nri_lost_seconds"); lost != 0 {
		t.Errorf("no NRI at all: nri_lost_seconds %v, want 0 (no fault to alert on)", lost)
	}
}
