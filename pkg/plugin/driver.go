package plugin

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce/podevents"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// perClaimPath is the path of every claim when NRI is off.
const perClaimPath = contract.PathPerClaim

// driverParts are what the driver is built from, made by the steps before it.
type driverParts struct {
	devices    []gpu.Device
	store      *checkpoint.Store
	metrics    *metrics.Metrics
	dra        *metrics.DRAMetrics
	paths      driver.PathSelector
	simulated  bool
	bootID     string
	quarantine *driver.Quarantine
	// onFatal is told of an error the DRA helper cannot recover from.
	onFatal func(error)
	// claims reads claims and writes their device status.
	claims driver.ClaimAPI
	// atStep is the crash tests' hook (Deps.AtStep).
	atStep func(driver.Step)
	// users are the containers that run with the claims (Deps.Users).
	users driver.ClaimUsers
	// events raises the plugin's events on pods (Deps.Events); nil without an API client.
	events *podevents.Recorder
	// migLayouts and mig are the MIG-managed GPUs and their MIG (Deps.MIGLayouts, Deps.MIG).
	migLayouts map[string]gpu.MIGLayout
	mig        gpu.MIG
}

// newDriver installs libvgpu.so into the state dir (VGPUSupport), builds the CDI writer and
// returns the driver over the checkpoint. It does not recover: Start calls Recover next.
func newDriver(ctx context.Context, cfg Config, layout claimdir.Layout, parts driverParts) (*driver.Driver, error) {
	logger := klog.FromContext(ctx)
	libraryInstalled := false
	if cfg.VGPU {
		lib, err := layout.InstallLibrary(cfg.LibrarySource)
		if err != nil {
			return nil, err
		}
		switch {
		case lib.SourceMissing:
			logger.Info("No libvgpu.so to install", "source", cfg.LibrarySource)
		case lib.Bytes > 0:
			logger.Info("Installed libvgpu.so", "source", cfg.LibrarySource, "path", layout.LibraryPath(), "bytes", lib.Bytes)
		}
		libraryInstalled = lib.Installed
		if !libraryInstalled {
			logger.Info("libvgpu.so is not installed in the state dir: containers get limits in their env, nothing in them enforces those, and the node's enforcer holds them to their memory only",
				"library", layout.LibraryPath(), "preload", layout.PreloadPath())
		}
	}
	writer, err := cdi.NewWriter(cdi.Options{
		DriverName: cfg.DriverName, SpecDir: cfg.CDIDir,
		RegistryDir: layout.RegistryDir(), LibraryPath: layout.LibraryPath(), PreloadPath: layout.PreloadPath(),
		LibraryInstalled: libraryInstalled, VGPU: cfg.VGPU,
		GPUInjection: cfg.GPUInjection, GPUCDIKind: cfg.GPUCDIKind,
	})
	if err != nil {
		return nil, err
	}
	var pcieRoot func(string) (deviceattribute.DeviceAttribute, error)
	numaNode := knownNUMANodes(parts.devices)
	if !parts.simulated {
		pcieRoot = func(busID string) (deviceattribute.DeviceAttribute, error) {
			return deviceattribute.GetPCIeRootAttributeByPCIBusID(busID)
		}
		numaNode = func(busID string) (deviceattribute.DeviceAttribute, error) {
			return deviceattribute.GetNUMANodeAttributeByPCIBusID(busID, deviceattribute.ScalarAttribute)
		}
	}
	var events driver.PodEvents
	if parts.events != nil { // not a typed nil in the interface
		events = parts.events
	}
	d, err := driver.New(driver.Config{
		DriverName: cfg.DriverName, NodeName: cfg.NodeName, MemoryReserve: cfg.MemoryReserve,
		VGPU: cfg.VGPU, BootID: parts.bootID, GPUInjection: cfg.GPUInjection, StaleInUse: cfg.StaleClaimContainers,
		HealthCheck: cfg.HealthCheck,
	}, driver.Deps{
		Devices: parts.devices, Checkpoint: parts.store, CDI: writer, Dirs: layout, Metrics: parts.metrics,
		Paths: parts.paths, PCIeRoot: pcieRoot, NUMANode: numaNode, NewUUID: func() string { return string(uuid.NewUUID()) },
		Quarantine: parts.quarantine, OnFatal: parts.onFatal, Claims: parts.claims, AtStep: parts.atStep, DRAMetrics: parts.dra,
		Users: parts.users, Events: events, MIGLayouts: parts.migLayouts, MIG: parts.mig,
	})
	if err != nil {
		return nil, fmt.Errorf("build the driver: %w", err)
	}
	return d, nil
}

// knownNUMANodes gives the standard numaNode attribute of the NUMA nodes the GPU source
// reported: simulated GPUs have made-up PCI addresses, so their NUMA nodes come from the
// source's own table (the same as the driver-local numaNode), never from this host's sysfs.
// The scalar form: the list form needs DRAListTypeAttributes in the cluster.
func knownNUMANodes(devices []gpu.Device) func(string) (deviceattribute.DeviceAttribute, error) {
	byBusID := map[string]int{}
	for _, g := range devices {
		if g.NUMANode != nil {
			byBusID[g.PCIBusID] = *g.NUMANode
		}
	}
	return func(busID string) (deviceattribute.DeviceAttribute, error) {
		node, ok := byBusID[busID]
		if !ok {
			return deviceattribute.DeviceAttribute{}, fmt.Errorf("NUMA node of PCI device %s unknown", busID)
		}
		return deviceattribute.GetNUMANodeAttribute(node, deviceattribute.ScalarAttribute)
	}
}
