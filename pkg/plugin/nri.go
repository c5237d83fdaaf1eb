package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/health"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
)

// nriSide is the embedded NRI plugin: its hooks with their container cache, and the supervisor
// that connects them to the runtime. It lives as long as the process, whoever owns the node.
type nriSide struct {
	plugin     *nri.Plugin
	supervisor *nri.Supervisor
	mu         sync.Mutex
	running    bool
}

// newNRISide builds the NRI plugin and its supervisor, not yet connected: the supervisor
// already decides the path of new claims, which the driver needs before it can recover. The
// plugin knows no claims until this instance owns the node (nri.Plugin.Own).
func newNRISide(cfg Config, layout claimdir.Layout, m *metrics.Metrics) *nriSide {
	logger := klog.Background().WithName("nri")
	nm := metrics.NewNRIMetrics(m.Registry)
	plugin := nri.NewPlugin(nri.Config{
		DriverName: cfg.DriverName, Layout: layout,
		SetNvidiaVisibleDevices: cfg.GPUInjection == cdi.InjectionEnv,
	}, noClaims{}, nm, logger)
	supervisor := nri.NewSupervisor(nri.SupervisorConfig{
		PluginName: cfg.DriverName, PluginIndex: cfg.NRIPluginIndex, Socket: cfg.NRISocket,
		FailureGrace: cfg.NRIFailureGrace, NoFailRequest: cfg.HandoverEnabled(),
	}, plugin, nm, logger)
	grace := cfg.NRIFailureGrace
	if grace <= 0 {
		grace = nri.DefaultFailureGrace
	}
	metrics.RegisterNRILost(m.Registry, supervisor.LostFor, grace)
	return &nriSide{plugin: plugin, supervisor: supervisor}
}

// start connects to the runtime as plugin index (in the background, retrying forever) and adds
// the liveness check; only the first call does anything.
func (n *nriSide) start(ctx context.Context, index string, checks *health.Server) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.running {
		return
	}
	n.running = true
	if index != "" {
		n.supervisor.UsePluginIndex(index)
	}
	go n.supervisor.Run(klog.NewContext(ctx, klog.FromContext(ctx).WithName("nri")))
	checks.Add("nri", n.supervisor.Check)
}

// started reports whether start ran.
func (n *nriSide) started() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.running
}

// serveDebug serves the debug endpoint until ctx ends or stop is called (socket "" disables
// it): the owner's.
func (n *nriSide) serveDebug(ctx context.Context, socket string) (stop func(), err error) {
	if socket == "" {
		return func() {}, nil
	}
	return nri.ServeDebug(ctx, socket, n.supervisor.DebugState)
}

// noClaims answers that nothing is prepared: what an instance knows before it owns the node.
type noClaims struct{}

func (noClaims) Prepared(string) (nri.Claim, bool) { return nri.Claim{}, false }
func (noClaims) List() []nri.Claim                 { return nil }
func (noClaims) ReservedFor(context.Context, string) ([]string, error) {
	return nil, errors.New("this instance does not own the node")
}

// NRICache is the embedded NRI plugin's container cache; nil when NRI is off.
func (p *Plugin) NRICache() *nri.Cache {
	if p.nri == nil {
		return nil
	}
	return p.nri.plugin.Cache()
}

// NRI is the NRI supervisor; nil when NRI is off.
func (p *Plugin) NRI() *nri.Supervisor {
	if p.nri == nil {
		return nil
	}
	return p.nri.supervisor
}

// checkpointClaims answers the NRI plugin's questions from the checkpoint and, on a
// reservedFor miss, from the API server.
type checkpointClaims struct {
	store      *checkpoint.Store
	kube       kubernetes.Interface
	quarantine *driver.Quarantine
	// recorder writes a re-read reservedFor to the checkpoint off the hook's path.
	recorder *reservedForRecorder
}

var _ nri.Claims = checkpointClaims{}

// newCheckpointClaims is the one adapter of the checkpoint and the API server that the NRI hook
// and the registry share; quarantine may be nil.
func newCheckpointClaims(store *checkpoint.Store, kube kubernetes.Interface, quarantine *driver.Quarantine, logger klog.Logger) checkpointClaims {
	return checkpointClaims{store: store, kube: kube, quarantine: quarantine, recorder: newReservedForRecorder(store, logger)}
}

func (c checkpointClaims) Prepared(claimUID string) (nri.Claim, bool) {
	cp, ok := c.store.Get(claimUID)
	if !ok {
		return nri.Claim{}, false
	}
	claim := toNRIClaim(claimUID, cp)
	if err := c.quarantine.Reason(claimUID); err != nil {
		claim.Quarantined = err.Error()
	}
	return claim, true
}

func (c checkpointClaims) List() []nri.Claim {
	snap := c.store.Snapshot()
	out := make([]nri.Claim, 0, len(snap.Claims))
	for uid, cp := range snap.Claims {
		out = append(out, toNRIClaim(uid, cp))
	}
	slices.SortFunc(out, func(a, b nri.Claim) int { return strings.Compare(a.UID, b.UID) })
	return out
}

// ReservedFor reads the claim once and records a changed reservedFor in the checkpoint, so
// that the next container of the same pod takes the fast path.
func (c checkpointClaims) ReservedFor(ctx context.Context, claimUID string) ([]string, error) {
	cp, ok := c.store.Get(claimUID)
	if !ok {
		return nil, fmt.Errorf("claim %s: %w", claimUID, checkpoint.ErrNotPrepared)
	}
	claim, err := c.kube.ResourceV1().ResourceClaims(cp.Namespace).Get(ctx, cp.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get claim %s/%s: %w", cp.Namespace, cp.Name, err)
	}
	if string(claim.UID) != claimUID {
		return nil, nil // deleted and re-created: not the prepared claim any more
	}
	pods := driver.ReservedPods(claim)
	c.recorder.record(claimUID, pods)
	return pods, nil
}

// reservedForRecorder writes re-read reservedFor lists to the checkpoint in the background:
// the read answers a CreateContainer that the runtime times out after 2 s, and an fsync'd
// checkpoint write (waiting on a group commit, or on a slow disk) must not count against that.
// The record only spares the next container of the pod a read, so it may lag; the newest list
// of a claim is written last (writes are serialised, and a flush takes the newest pending).
type reservedForRecorder struct {
	set    func(claimUID string, pods []string) error
	logger klog.Logger

	mu      sync.Mutex
	pending map[string][]string
	writeMu sync.Mutex
}

func newReservedForRecorder(store *checkpoint.Store, logger klog.Logger) *reservedForRecorder {
	return &reservedForRecorder{set: store.SetReservedFor, logger: logger, pending: map[string][]string{}}
}

func (r *reservedForRecorder) record(claimUID string, pods []string) {
	r.mu.Lock()
	r.pending[claimUID] = pods
	r.mu.Unlock()
	go r.flush(claimUID)
}

func (r *reservedForRecorder) flush(claimUID string) {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	r.mu.Lock()
	pods, ok := r.pending[claimUID]
	delete(r.pending, claimUID)
	r.mu.Unlock()
	if !ok {
		return // a flush before this one wrote the newest list
	}
	if err := r.set(claimUID, pods); err != nil && !errors.Is(err, checkpoint.ErrNotPrepared) {
		r.logger.Error(err, "Recording reservedFor in the checkpoint failed; the next container of the pod reads the claim again", "claim", claimUID)
	}
}

// toNRIClaim converts a checkpoint record. Every result's CDI device IDs are, in order, its
// own device, the claim-common device and optionally the GPU's (cdi.Writer.DeviceIDs).
func toNRIClaim(uid string, cp checkpoint.Claim) nri.Claim {
	c := nri.Claim{
		UID: uid, Namespace: cp.Namespace, Name: cp.Name, Path: cp.Path,
		Completed: cp.State == checkpoint.PrepareCompleted, ReservedFor: cp.ReservedFor,
	}
	for _, dev := range cp.Devices {
		r := nri.Result{
			Request: dev.Request, Device: dev.Device, ShareID: dev.ShareID, GPUUUID: dev.VisibleUUID(), Index: dev.Index,
			MemoryBytes: dev.MemoryBytes, Cores: dev.Cores, AdminAccess: dev.AdminAccess,
		}
		if len(dev.CDIDeviceIDs) > 0 {
			r.CDIDevice = dev.CDIDeviceIDs[0]
		}
		if len(dev.CDIDeviceIDs) > 1 && c.CommonCDIDevice == "" {
			c.CommonCDIDevice = dev.CDIDeviceIDs[1]
		}
		c.Results = append(c.Results, r)
	}
	return c
}
