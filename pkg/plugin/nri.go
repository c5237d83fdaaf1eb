package plugin

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	"github.com/vgpu-dra/vgpu-dra/pkg/nri"
)

// debugSocketName is the debug socket's name in the state directory when --debug-socket is
// not set.
const debugSocketName = "debug.sock"

// DebugSocketPath is where the debug endpoint listens: DebugSocket, or <state>/debug.sock
// when empty; "-" disables it.
func (c Config) DebugSocketPath() string {
	switch c.DebugSocket {
	case "-":
		return ""
	case "":
		return filepath.Join(c.StateDir, debugSocketName)
	}
	return c.DebugSocket
}

// claimPaths builds the embedded NRI plugin and its supervisor (not yet connected) when NRI is
// on, and returns what decides the path of newly prepared claims.
func (p *Plugin) claimPaths(store *checkpoint.Store, dirs claimdir.Layout) driver.PathSelector {
	if !p.cfg.NRI {
		return driver.StaticPath(contract.PathPerClaim)
	}
	logger := klog.Background().WithName("nri")
	m := metrics.NewNRIMetrics(p.metrics.Registry)
	plugin := nri.NewPlugin(nri.Config{Layout: dirs}, checkpointClaims{store: store, kube: p.kube}, m, logger)
	p.nriCache = plugin.Cache()
	p.nri = nri.NewSupervisor(nri.SupervisorConfig{
		PluginName: p.cfg.DriverName, PluginIndex: p.cfg.NRIPluginIndex, Socket: p.cfg.NRISocket,
		FailureGrace: p.cfg.NRIFailureGrace,
	}, plugin, m, logger)
	return p.nri
}

// startNRI connects the NRI plugin (after the checkpoint is loaded and recovered), adds its
// liveness check and serves the debug endpoint.
func (p *Plugin) startNRI(ctx context.Context) error {
	if p.nri == nil {
		return nil
	}
	go p.nri.Run(klog.NewContext(ctx, klog.FromContext(ctx).WithName("nri")))
	p.health.Add("nri", p.nri.Check)
	if path := p.cfg.DebugSocketPath(); path != "" {
		if err := nri.ServeDebug(ctx, path, p.nri.DebugState); err != nil {
			return err
		}
	}
	return nil
}

// NRICache is the embedded NRI plugin's container cache; nil when NRI is off.
func (p *Plugin) NRICache() *nri.Cache { return p.nriCache }

// NRI is the NRI supervisor; nil when NRI is off.
func (p *Plugin) NRI() *nri.Supervisor { return p.nri }

// checkpointClaims answers the NRI plugin's questions from the checkpoint and, on a
// reservedFor miss, from the API server.
type checkpointClaims struct {
	store *checkpoint.Store
	kube  kubernetes.Interface
}

var _ nri.Claims = checkpointClaims{}

func (c checkpointClaims) Prepared(claimUID string) (nri.Claim, bool) {
	cp, ok := c.store.Get(claimUID)
	if !ok {
		return nri.Claim{}, false
	}
	return toNRIClaim(claimUID, cp), true
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
		return nil, fmt.Errorf("claim %s is not prepared", claimUID)
	}
	claim, err := c.kube.ResourceV1().ResourceClaims(cp.Namespace).Get(ctx, cp.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get claim %s/%s: %w", cp.Namespace, cp.Name, err)
	}
	if string(claim.UID) != claimUID {
		return nil, nil // deleted and re-created: not the prepared claim any more
	}
	pods := driver.ReservedPods(claim)
	if slices.Equal(pods, cp.ReservedFor) {
		return pods, nil
	}
	err = c.store.Update(func(d *checkpoint.Data) error {
		if rec, ok := d.Claims[claimUID]; ok {
			rec.ReservedFor = slices.Clone(pods)
			d.Claims[claimUID] = rec
		}
		return nil
	})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Recording reservedFor in the checkpoint failed", "claim", klog.KObj(claim))
	}
	return pods, nil
}

// toNRIClaim converts a checkpoint record. Every result's CDI device IDs are, in order, its
// own device, the claim-common device and optionally the GPU's (cdi.Writer.DeviceIDs).
func toNRIClaim(uid string, cp checkpoint.Claim) nri.Claim {
	c := nri.Claim{
		UID: uid, Namespace: cp.Namespace, Name: cp.Name, Path: cp.Path,
		Completed: cp.State == checkpoint.PrepareCompleted, ReservedFor: cp.ReservedFor,
	}
	for _, dev := range cp.Devices {
		r := nri.Result{Request: dev.Request, Device: dev.Device, ShareID: dev.ShareID, GPUUUID: dev.GPUUUID, Index: dev.Index}
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
