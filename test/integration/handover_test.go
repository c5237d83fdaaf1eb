package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/handover"
	"github.com/vgpu-dra/vgpu-dra/pkg/instancelock"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// churn runs vGPU "pods" one after the other in each of workers goroutines until stop: a claim
// prepared through the kubelet protocol (on whichever instance the kubelet picks), its container
// created and started through containerd's NRI runtime side, checked to be adjusted exactly
// once, then stopped, removed and unprepared. Every failure is recorded.
type churn struct {
	t        *testing.T
	n        *node
	k        *rollingKubelet
	mu       sync.Mutex
	done     int
	failures []string
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startChurn(t *testing.T, n *node, k *rollingKubelet, workers int) *churn {
	c := &churn{t: t, n: n, k: k, stop: make(chan struct{})}
	for w := range workers {
		c.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-c.stop:
					return
				default:
				}
				err := c.once(fmt.Sprintf("churn-%d-%d", w, i))
				c.mu.Lock()
				if err != nil {
					c.failures = append(c.failures, err.Error())
				} else {
					c.done++
				}
				c.mu.Unlock()
			}
		})
	}
	return c
}

func (c *churn) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

// waitMore waits until n more pods have gone through.
func (c *churn) waitMore(n int) {
	c.t.Helper()
	want := c.count() + n
	eventually(c.t, 2*time.Minute, fmt.Sprintf("%d churned pods", want), func() bool { return c.count() >= want })
}

func (c *churn) finish() []string {
	close(c.stop)
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failures
}

func (c *churn) once(name string) error {
	ctx := context.Background()
	claimMu.Lock()
	claim := c.n.newClaim(name, allocated{request: "gpu", device: "gpu-0", memory: "1Gi", cores: 5, shareID: shareFor(name)})
	claimMu.Unlock()
	resp, err := c.k.prepare(claim)
	if err != nil || resp.GetError() != "" {
		return fmt.Errorf("%s: prepare: %v %s", name, err, resp.GetError())
	}
	pod := podOf(claim)
	if err := c.n.nri.runPod(ctx, pod); err != nil {
		return fmt.Errorf("%s: run pod: %w", name, err)
	}
	id := "ctr-" + name
	adj, err := c.n.nri.create(ctx, pod.Id, c.n.vgpuContainer(id, "app", resp, string(claim.UID)))
	if err != nil {
		return fmt.Errorf("%s: create container: %w", name, err)
	}
	if !adjustedOnce(adj) {
		return fmt.Errorf("%s: the container was not adjusted exactly once: %v", name, adj)
	}
	if err := c.n.nri.start(ctx, id, uint32(os.Getpid())); err != nil {
		return fmt.Errorf("%s: start container: %w", name, err)
	}
	if err := c.n.nri.stop(ctx, id); err != nil {
		return fmt.Errorf("%s: stop container: %w", name, err)
	}
	if err := c.n.nri.remove(ctx, id); err != nil {
		return fmt.Errorf("%s: remove container: %w", name, err)
	}
	if msg, err := c.k.unprepare(claim); err != nil || msg != "" {
		return fmt.Errorf("%s: unprepare: %v %s", name, err, msg)
	}
	return nil
}

// claimMu serialises newClaim (its UID sequence) across the churn's goroutines.
var claimMu sync.Mutex

// shareFor is a share ID of its own for each claim (results of one GPU need distinct shares).
func shareFor(name string) string {
	h := uint32(2166136261)
	for _, b := range []byte(name) {
		h = (h ^ uint32(b)) * 16777619
	}
	return fmt.Sprintf("5a4e%04x-0000-4000-8000-%012x", h&0xffff, h)
}

// registrar is a vGPU container with a real process in a real cgroup whose library registers
// again and again (each registration with the client's retries, as libvgpu.so does) while the
// node changes hands; every registration must end OK.
type registrar struct {
	t       *testing.T
	h       registry.CgroupHierarchy
	cg      rt.Cgroup
	req     registry.Request
	socket  string
	stop    chan struct{}
	done    chan struct{}
	reports []rt.Report
}

func startRegistrar(t *testing.T, n *node, k *rollingKubelet) *registrar {
	t.Helper()
	h := rt.Hierarchies(t)[0]
	ctx := t.Context()
	claim := n.newClaim("registrar", allocated{request: "gpu", device: "gpu-1", memory: "1Gi", cores: 5, shareID: shareN1})
	resp, err := k.prepare(claim)
	if err != nil || resp.GetError() != "" {
		t.Fatalf("prepare: %v %s", err, resp.GetError())
	}
	pod := podOf(claim)
	if err := n.nri.runPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	adj, err := n.nri.create(ctx, pod.Id, n.vgpuContainer("ctr-registrar", "app", resp, string(claim.UID)))
	if err != nil || !adjustedOnce(adj) {
		t.Fatalf("create the registrar's container: %v %v", adj, err)
	}
	r := &registrar{t: t, h: h, cg: rt.NewCgroup(t, h), socket: filepath.Join(n.cfg.StateDir, "registry", "registry.sock"),
		stop: make(chan struct{}), done: make(chan struct{})}
	for _, e := range adj.GetEnv() {
		switch e.Key {
		case "VGPU_POD_UID":
			r.req.PodUID = e.Value
		case "VGPU_CONTAINER_NAME":
			r.req.ContainerName = e.Value
		}
	}
	initProc := rt.StartChild(t, r.cg, rt.Spec{})
	if err := n.nri.start(ctx, "ctr-registrar", uint32(initProc.PID)); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(r.done)
		for {
			select {
			case <-r.stop:
				return
			default:
			}
			child := rt.StartChild(t, r.cg, rt.Spec{Socket: r.socket, Count: 50, Request: r.req})
			r.reports = append(r.reports, child.Report(t))
			child.Stop()
		}
	}()
	return r
}

// finish stops and returns every registration's status that was not OK, and how many there were.
func (r *registrar) finish() (bad []string, total int) {
	close(r.stop)
	<-r.done
	for _, rep := range r.reports {
		for i, s := range rep.Statuses {
			total++
			if s != "OK" {
				bad = append(bad, s+": "+rep.Messages[i])
			}
		}
	}
	return bad, total
}

// TestHandoverWhilePodsStart is the rolling update of issue 17 on one node: while vGPU pods are
// prepared, created, started and removed without pause, and a container's library registers
// over and over, a second instance starts, observes, and takes the node over; then the first
// exits. No Prepare, Unprepare, CreateContainer or registration may fail; every container is
// adjusted exactly once (containerd's adaptation fails one that two plugins adjust); at the end
// the new instance alone owns the node — the lock, the registry socket, the checkpoint, which
// holds exactly the claims still prepared — and it recorded the pause.
func TestHandoverWhilePodsStart(t *testing.T) {
	n := newNode(t)
	old := n.startInstance(podOld)
	k := startRollingKubelet(t, n)
	eventually(t, 30*time.Second, "the kubelet to register the first instance", func() bool { return k.registered() == 1 })
	reg := startRegistrar(t, n, k)
	ch := startChurn(t, n, k, 3)
	ch.waitMore(6)

	succ := n.startInstance(podNew)
	eventually(t, time.Minute, "the new instance to own the node", func() bool { return succ.Owner() && !old.Owner() })
	eventually(t, 30*time.Second, "the kubelet to register the new instance", func() bool { return k.registered() == 2 })
	// Both registered, the old one forwarding what reaches it.
	ch.waitMore(9)
	if got := readiness(t, succ); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("the new owner's readiness: %v, want SERVING", got)
	}
	if got := readiness(t, old); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("the old instance's readiness after the handover: %v, want NOT_SERVING", got)
	}
	// The kubelet prefers the new registration once it is connected; then the DaemonSet deletes
	// the old pod.
	k.avoid(n, podOld)
	old.Stop()
	eventually(t, 30*time.Second, "the kubelet to drop the old instance", func() bool { return k.registered() == 1 })
	ch.waitMore(6)

	failures := ch.finish()
	bad, total := reg.finish()
	t.Logf("%d churned pods, %d registrations across the handover", ch.count(), total)
	for _, f := range failures {
		t.Errorf("churn: %s", f)
	}
	for _, b := range bad {
		t.Errorf("registration: %s", b)
	}
	if total == 0 {
		t.Error("no registration ran across the handover")
	}

	holder := instancelock.ReadHolder(n.cfg.InstanceLockPath())
	if rec, ok := handover.ParseRecord(holder.Record); !ok || rec.PodUID != podNew {
		t.Errorf("the lock's record %q does not name the new pod", holder.Record)
	}
	if _, err := instancelock.TryAcquire(n.cfg.InstanceLockPath()); !errors.Is(err, instancelock.ErrHeld) {
		t.Errorf("the instance lock is not held after the handover: %v", err)
	}
	cp, err := checkpoint.Load(n.cfg.CheckpointPath())
	if err != nil {
		t.Fatalf("the checkpoint after the handover: %v", err)
	}
	var names []string
	for _, c := range cp.Claims {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, []string{"registrar"}) {
		t.Errorf("the checkpoint holds %v, want only the registrar's claim (every churned claim was unprepared)", names)
	}
	if got := instanceMetric(t, succ, "vgpu_dra_handover_pause_seconds"); got != 1 {
		t.Errorf("the new owner recorded %v handover pauses, want 1", got)
	}
	if got := instanceMetric(t, succ, "vgpu_dra_handover_events_total", "event", "took_over"); got != 1 {
		t.Errorf("handover_events_total{event=took_over} = %v, want 1", got)
	}
	if got := instanceMetric(t, succ, "vgpu_dra_handover_owner"); got != 1 {
		t.Errorf("handover_owner of the new instance = %v, want 1", got)
	}
	resp, err := (&registry.Client{Socket: reg.socket}).RegisterOnce(context.Background(), reg.req)
	if err != nil || resp.Status != registry.StatusDenied {
		t.Errorf("the registry after the old instance exited: %v %v, want the new owner's DENIED for a caller outside the container", resp.Status, err)
	}
}

// TestHandoverCalledOffWhenTheCheckpointIsUnreadable: a new instance that cannot read what the
// owner wrote (a downgrade past a checkpoint format change) never takes the node over: the owner
// keeps serving — Prepare, and containers adjusted exactly once although two plugins of one name
// are registered with the runtime — and the new instance is not ready, so the rolling update
// waits instead of breaking the node; it says why.
func TestHandoverCalledOffWhenTheCheckpointIsUnreadable(t *testing.T) {
	n := newNode(t)
	old := n.startInstance(podOld)
	k := startRollingKubelet(t, n)
	eventually(t, 30*time.Second, "the kubelet to register the first instance", func() bool { return k.registered() == 1 })
	regs := n.nri.registrations()
	succ := n.startInstance(podNew, func(_ *plugin.Config, d *plugin.Deps) {
		d.LoadCheckpoint = func(path string) (checkpoint.Data, error) {
			return checkpoint.Data{}, &checkpoint.VersionError{Path: path, Version: "v3", Writer: "vgpu-dra v9"}
		}
	})
	eventually(t, 30*time.Second, "the new instance to register with NRI and be refused the checkpoint", func() bool {
		return n.nri.registrations() > regs && instanceMetric(t, succ, "vgpu_dra_handover_events_total", "event", "called_off") >= 1
	})
	if !old.Owner() || succ.Owner() {
		t.Fatalf("owner: old %v, new %v; want the old one", old.Owner(), succ.Owner())
	}
	if got := readiness(t, succ); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("readiness of an instance that cannot take over: %v, want NOT_SERVING", got)
	}
	ch := startChurn(t, n, k, 2)
	ch.waitMore(6)
	for _, f := range ch.finish() {
		t.Errorf("churn while the new instance observes: %s", f)
	}
	if !old.Owner() {
		t.Error("the old instance lost the node")
	}
}

// TestHandoverFromAnOwnerThatDoesNotHandOver: the lock's holder wrote no handover record (a
// plugin from before contract §14, or the device plugin). A new instance then cannot take over
// while it lives; it is ready — so that a rolling update deletes the holder — and takes the node
// as soon as the lock is free.
func TestHandoverFromAnOwnerThatDoesNotHandOver(t *testing.T) {
	n := newNode(t)
	if err := os.MkdirAll(filepath.Dir(n.cfg.InstanceLockPath()), 0o750); err != nil {
		t.Fatal(err)
	}
	legacy, err := instancelock.TryAcquire(n.cfg.InstanceLockPath())
	if err != nil {
		t.Fatal(err)
	}
	succ := n.startInstance(podNew)
	eventually(t, 30*time.Second, "the new instance to be ready while it waits", func() bool {
		return readiness(t, succ) == healthpb.HealthCheckResponse_SERVING
	})
	if succ.Owner() {
		t.Fatal("the new instance owns the node while the old holder lives")
	}
	_ = legacy.Release()
	eventually(t, 30*time.Second, "the new instance to take the free node", succ.Owner)
	if got := instanceMetric(t, succ, "vgpu_dra_handover_events_total", "event", "owner_gone"); got != 1 {
		t.Errorf("handover_events_total{event=owner_gone} = %v, want 1", got)
	}
}

// TestRetiredInstanceDoesNotTakeTheNodeBack: the old pod's container restarts after it handed
// the node over (the DaemonSet has not deleted the pod yet). It must not ask for the node back —
// two pods would hand it to and fro — only take it when the owner goes.
func TestRetiredInstanceDoesNotTakeTheNodeBack(t *testing.T) {
	n := newNode(t)
	old := n.startInstance(podOld)
	succ := n.startInstance(podNew)
	eventually(t, time.Minute, "the new instance to own the node", succ.Owner)
	old.Stop()
	again := n.startInstance(podOld)
	eventually(t, 30*time.Second, "the owner to refuse the restarted old instance as retired", func() bool { return again.Ownership().Retired })
	if again.Owner() || !succ.Owner() {
		t.Fatalf("owner: restarted old %v, new %v; want the new one", again.Owner(), succ.Owner())
	}
	if got := readiness(t, again); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("readiness of a retired instance: %v, want NOT_SERVING", got)
	}
	succ.Stop()
	eventually(t, 30*time.Second, "the old pod's instance to take the node when the owner goes", again.Owner)
}

// TestHandoverBetweenNRISettings: an upgrade that turns NRISupport on (or off) hands over too:
// an owner without NRI has no NRI index, and the successor registers with its configured one;
// afterwards the new owner adjusts containers.
func TestHandoverBetweenNRISettings(t *testing.T) {
	n := newNode(t)
	old := n.startInstance(podOld, func(c *plugin.Config, _ *plugin.Deps) { c.NRI = false })
	succ := n.startInstance(podNew)
	eventually(t, time.Minute, "the instance with NRI to own the node", func() bool { return succ.Owner() && !old.Owner() })
	if got := succ.Ownership().NRIIndex; got != "00" {
		t.Errorf("NRI index after an owner without NRI = %q, want the configured 00", got)
	}
	old.Stop()
	k := startRollingKubelet(t, n)
	eventually(t, 30*time.Second, "the kubelet to register the owner", func() bool { return k.registered() == 1 })
	ch := startChurn(t, n, k, 1)
	ch.waitMore(3)
	for _, f := range ch.finish() {
		t.Errorf("churn after the handover: %s", f)
	}
}
