// Package driver is the DRA kubelet plugin proper: it publishes the node's GPUs as ResourceSlices
// and implements kubeletplugin.DRAPlugin (Prepare, Unprepare, WatchHealthStatus). It keeps the
// prepared state in the checkpoint and turns allocations into claim directories and CDI specs.
//
// It knows nothing of feature gates or flags: cmd turns those into Config.
package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// Config is the plain configuration of the driver.
type Config struct {
	DriverName string
	NodeName   string
	// MemoryReserve is subtracted from every GPU's published memory (bytes).
	MemoryReserve int64
	// VGPU publishes GPUs as shareable with consumable memory and cores (gate VGPUSupport).
	VGPU bool
	// BootID identifies this boot of the node (/proc/sys/kernel/random/boot_id).
	BootID string
	// GPUInjection is how the GPU itself reaches containers (--gpu-injection). With
	// cdi.InjectionEnv a per-claim claim may hold one GPU only (see prepareOne).
	GPUInjection cdi.Injection
	// Publish paces ResourceSlice publishing; zero values take the defaults (publish.go).
	Publish PublishTiming
	// StaleInUse is what the reconciliation does with the running containers of a claim the
	// API server no longer has in use here (--stale-claim-containers; "" is StaleInUseKeep).
	StaleInUse StaleInUsePolicy
	// HealthCheck says that the GPUs' health is watched (gate DeviceHealthCheck): each result's
	// device status carries a Healthy condition (healthstatus.go).
	HealthCheck bool
}

// PathSelector decides, when a claim is first prepared, which path its containers take
// (contract §3). The decision is recorded in the checkpoint and never changes afterwards.
type PathSelector interface {
	ClaimPath(ctx context.Context) contract.ClaimPath
}

// StaticPath always selects the same path.
type StaticPath contract.ClaimPath

// ClaimPath implements PathSelector.
func (p StaticPath) ClaimPath(context.Context) contract.ClaimPath { return contract.ClaimPath(p) }

// Publisher publishes ResourceSlices; *kubeletplugin.Helper implements it.
type Publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// Deps are the driver's collaborators, injected so tests can use temp dirs and fakes.
type Deps struct {
	Devices    []gpu.Device // the node's GPUs, sorted by index
	Checkpoint *checkpoint.Store
	CDI        *cdi.Writer
	Dirs       claimdir.Layout
	Metrics    *metrics.Metrics
	Paths      PathSelector
	// NewUUID mints per-claim register UUIDs (canonical lower-case).
	NewUUID func() string
	// Quarantine receives the claims recovery cannot restore; one is made when nil.
	Quarantine *Quarantine
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// PCIeRoot resolves a GPU's PCI bus ID to the standard pcieRoot attribute (on real nodes
	// deviceattribute.GetPCIeRootAttributeByPCIBusID over sysfs). Nil: no pcieRoot attribute —
	// simulated GPUs have made-up bus IDs that may well exist on the host for another device.
	PCIeRoot func(pciBusID string) (deviceattribute.DeviceAttribute, error)
	// NUMANode resolves a GPU's PCI bus ID to the standard numaNode attribute (KEP-6072; on
	// real nodes deviceattribute.GetNUMANodeAttributeByPCIBusID over sysfs, in its scalar
	// form). An error — no NUMA affinity (-1), an unknown device — leaves the attribute out.
	// Nil: no standard numaNode attribute.
	NUMANode func(pciBusID string) (deviceattribute.DeviceAttribute, error)
	// OnFatal is told, once, of an error the DRA helper cannot recover from (its gRPC servers
	// failed): the process must exit so that the DaemonSet restarts it. Nil: only logged.
	OnFatal func(error)
	// Claims reads claims and writes their device status, in the background (status.go,
	// reconcile.go). Nil: no device status is written and nothing is reconciled.
	Claims ClaimAPI
	// Events raises the events on the pods of the claims whose GPU's health changed
	// (healthstatus.go). Nil: none is raised.
	Events PodEvents
	// Users tells which containers still run with a claim, for the reconciliation (inuse.go).
	// Nil: none is known, and a stale claim is unprepared at once.
	Users ClaimUsers
	// AtStep is called at each Step of Prepare and Unprepare (steps.go); tests only, nil in
	// production.
	AtStep func(Step)
	// MIGLayouts are the MIG-managed GPUs (--mig-gpus) by UUID, with what each can be split
	// into (contract §18); MIG creates and destroys their instances. Both nil: no MIG.
	MIGLayouts map[string]gpu.MIGLayout
	MIG        gpu.MIG
	// DRAMetrics are the driver's metrics on Metrics.Registry; made there when nil. A process
	// that builds a driver again (it took the node back after a handover) passes the first's:
	// a registry takes each metric once.
	DRAMetrics *metrics.DRAMetrics
}

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	cfg     Config
	deps    Deps
	devices []gpu.Device
	byName  map[string]gpu.Device
	// migByName are the MIG-managed GPUs' partitions by device name; byName has their GPU.
	migByName map[string]migDevice
	// migMu serialises the changes to MIG instances and modes (mig_prepare.go).
	migMu     sync.Mutex
	health    *deviceHealth
	locks     *claimLocks
	publisher Publisher
	// publishKick asks the publishing loop for a publish of the current state (buffered: one
	// pending request stands for any number).
	publishKick chan struct{}
	fatalOnce   sync.Once
	dra         *metrics.DRAMetrics
	status      *statusWriter
	admitted    *admissions
	removals    *dirRemovals
	// fileSlots bounds the claims whose files are being made or removed at once (withFiles).
	fileSlots chan struct{}
	// prepares holds, per claim UID, the number of its latest Prepare call, so that the
	// reconciliation leaves alone a claim that a Prepare touched while it was reading the API
	// server (reconcile.go).
	preparesMu sync.Mutex
	prepareSeq uint64
	prepares   map[string]uint64
	now        func() time.Time
	// inUse are the stale claims the reconciliation keeps for their running containers.
	inUse staleInUse
	// healthRetry is the first delay before a claim whose GPU's health changed is read again.
	healthRetry time.Duration
	// healthNoticed, when set (tests), is called once the claims of a health change were told.
	healthNoticed func(gpu.HealthEvent)
}

var _ kubeletplugin.DRAPlugin = &Driver{}

// New checks the configuration and returns a driver that has not yet touched the disk.
func New(cfg Config, deps Deps) (*Driver, error) {
	switch {
	case cfg.DriverName == "":
		return nil, errors.New("driver name is empty")
	case cfg.NodeName == "":
		return nil, errors.New("node name is empty")
	case cfg.MemoryReserve < 0:
		return nil, fmt.Errorf("memory reserve %d is negative", cfg.MemoryReserve)
	case cfg.StaleInUse == StaleInUseStop && deps.Users == nil:
		return nil, errors.New("stopping the containers of stale claims needs a view of the node's containers")
	case len(deps.MIGLayouts) > 0 && deps.MIG == nil:
		return nil, errors.New("MIG-managed GPUs need the GPU source's MIG")
	case deps.Checkpoint == nil || deps.CDI == nil || deps.Metrics == nil || deps.Paths == nil || deps.NewUUID == nil:
		return nil, errors.New("driver dependencies are incomplete")
	}
	d := &Driver{
		cfg: cfg, deps: deps, devices: deps.Devices,
		byName: map[string]gpu.Device{}, migByName: map[string]migDevice{}, health: newDeviceHealth(), locks: newClaimLocks(),
		publishKick: make(chan struct{}, 1), dra: deps.DRAMetrics,
		prepares: map[string]uint64{}, now: deps.Now, inUse: staleInUse{claims: map[string]string{}},
		admitted: newAdmissions(), fileSlots: make(chan struct{}, fileParallelism), removals: newDirRemovals(),
		healthRetry: healthReadRetry,
	}
	if d.dra == nil {
		d.dra = metrics.NewDRAMetrics(deps.Metrics.Registry)
	}
	if d.now == nil {
		d.now = time.Now
	}
	if deps.Claims != nil {
		d.status = newStatusWriter(deps.Claims, cfg.NodeName, d.now, d.dra)
	}
	if d.deps.Quarantine == nil {
		d.deps.Quarantine = NewQuarantine(nil)
	}
	for _, g := range deps.Devices {
		d.byName[DeviceName(g.Index)] = g
		if l, ok := deps.MIGLayouts[g.UUID]; ok {
			for _, m := range migDevicesOf(g, l) {
				name := MIGDeviceName(g.Index, m.profile.Name, m.at.Start)
				d.byName[name], d.migByName[name] = g, m
			}
		}
	}
	return d, nil
}

// Recover brings the disk in line with the checkpoint before anything is served: completed
// claims get their missing claim directories and CDI specs back (a reboot empties /var/run/cdi),
// claims left in PrepareStarted (by a crash of a plugin of an earlier version, which recorded
// that state first) are rolled back (the kubelet prepares them again), and the claim
// directories and CDI specs of claims that the checkpoint does not know — what a crash of
// Prepare before its record leaves — are removed. On MIG-managed GPUs the MIG instances are
// brought in line first (recoverMIG).
//
// A claim that cannot be restored (or rolled back) is quarantined with the reason, logged and
// counted, and the others are served: one bad claim must not make the plugin crash-loop and
// strand every claim of the node. Only what concerns the whole node — recording the boot ID,
// listing the claim directories — fails recovery.
func (d *Driver) Recover(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	snap := d.deps.Checkpoint.Snapshot()
	if snap.BootID != d.cfg.BootID {
		if snap.BootID != "" {
			logger.Info("Node rebooted since the checkpoint was written; re-creating CDI specs", "claims", len(snap.Claims))
		}
		if err := d.deps.Checkpoint.Update(func(data *checkpoint.Data) error {
			data.BootID = d.cfg.BootID
			return nil
		}); err != nil {
			return fmt.Errorf("record boot ID in checkpoint: %w", err)
		}
	}
	// The MIG instances first: a partition made again has a new UUID, which its files name.
	claims := maps.Clone(snap.Claims)
	migFailed, err := d.recoverMIG(ctx, claims)
	if err != nil {
		return err
	}
	for uid, claim := range claims {
		var err error
		switch {
		case migFailed[uid] != nil:
			err = fmt.Errorf("restore claim %s/%s (%s): %w", claim.Namespace, claim.Name, uid, migFailed[uid])
		case claim.State == checkpoint.PrepareCompleted:
			if err = d.ensureFiles(uid, claim); err != nil {
				err = fmt.Errorf("restore files of claim %s/%s (%s): %w", claim.Namespace, claim.Name, uid, err)
			}
		default:
			logger.Info("Rolling back a claim whose preparation did not complete", "claim", klog.KRef(claim.Namespace, claim.Name), "uid", uid)
			err = d.unprepareOne(uid)
		}
		if err != nil {
			logger.Error(err, "Quarantining a claim that recovery could not restore; the other claims are served", "claim", klog.KRef(claim.Namespace, claim.Name), "uid", uid)
			d.deps.Quarantine.set(uid, err)
		}
	}
	err = errors.Join(d.removeOrphans(logger, "CDI spec", d.deps.CDI.ListClaims, d.deps.CDI.Remove),
		d.removeOrphans(logger, "claim directory", d.deps.Dirs.ListClaims, d.deps.Dirs.RemoveClaim))
	d.updateGauges()
	return err
}

func (d *Driver) updateGauges() {
	d.deps.Metrics.PreparedClaims.Set(float64(d.deps.Checkpoint.Len()))
}

// removeOrphans removes what (claim directories, CDI specs) of claims that the checkpoint does
// not know: list names the claims that have one, remove removes a claim's.
func (d *Driver) removeOrphans(logger klog.Logger, what string, list func() ([]string, error), remove func(uid string) error) error {
	uids, err := list()
	if err != nil {
		return fmt.Errorf("list the claims that have a %s: %w", what, err)
	}
	for _, uid := range uids {
		if _, ok := d.deps.Checkpoint.Get(uid); ok {
			continue
		}
		logger.Info("Removing the "+what+" of a claim that is not prepared", "uid", uid)
		if err := remove(uid); err != nil {
			return fmt.Errorf("remove orphan %s of claim %s: %w", what, uid, err)
		}
	}
	return nil
}
