package gpu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// simulatedProfiles are the systems NewSimulated can pretend to be, by name.
var simulatedProfiles = map[string]func() *server.Server{
	"dgx-a100": dgxa100.New, // 8 x NVIDIA A100-SXM4-40GB
	"dgx-h100": dgxh100.New, // 8 x NVIDIA H100 80GB HBM3
	"dgx-h200": dgxh200.New, // 8 x NVIDIA H200 141GB HBM3e
	"dgx-b200": dgxb200.New, // 8 x NVIDIA B200 180GB HBM3e
}

// simulatedEventTypes is what a simulated GPU says it supports, as a data-centre GPU does; the
// watcher registers the part of it that it needs.
const simulatedEventTypes uint64 = nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError |
	nvml.EventTypePState | nvml.EventTypeXidCriticalError | nvml.EventTypeClock | nvml.EventTypeGpuRecoveryAction

// SimulatedProfiles returns the profile names NewSimulated accepts, sorted.
func SimulatedProfiles() []string {
	names := make([]string, 0, len(simulatedProfiles))
	for name := range simulatedProfiles {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Simulated is a GPU source served by go-nvml's mock of a DGX system. It runs the same NVML code
// as the real source (Devices, WatchHealth) and opens no library, so it works in a plugin pod on
// a node without GPUs. Everything it reports is deterministic: the same node, profile and count
// give the same devices on every start. UUIDs are derived from the node name as well, so that
// two simulated nodes never publish the same GPU: anything keyed by UUID across the cluster
// (metrics, kubectl vgpu, dashboards) would mix them up.
type Simulated struct {
	src     *nvmlSource
	node    string
	profile string
	server  *server.Server
	visible []*server.Device // the first count GPUs, by index
	events  *simEventHub
	// recovery holds the GPUs' NVML recovery actions (simulated_recovery.go).
	recovery *simRecovery
	usage    *simUsage
	// mig holds the GPUs' MIG state (simulated_mig.go).
	mig *simMIG
}

var _ Source = (*Simulated)(nil)

// NewSimulated pretends to be the system profile names (see SimulatedProfiles) with its first
// count GPUs, all of them when count is 0, on the node named node (the GPUs' UUIDs derive from
// it; it must not be empty).
func NewSimulated(profile string, count int, node string) (*Simulated, error) {
	if node == "" {
		return nil, errors.New("simulated GPUs need the node's name: their UUIDs are derived from it")
	}
	newServer, ok := simulatedProfiles[profile]
	if !ok {
		return nil, fmt.Errorf("unknown simulated GPU profile %q: want one of %s",
			profile, strings.Join(SimulatedProfiles(), ", "))
	}
	srv := newServer()
	total := len(srv.Devices)
	if count < 0 || count > total {
		return nil, fmt.Errorf("simulated GPU profile %s has %d GPUs: count %d not in 0..%d (0 = all)",
			profile, total, count, total)
	}
	if count == 0 {
		count = total
	}
	s := &Simulated{node: node, profile: profile, server: srv, events: newSimEventHub(), usage: newSimUsage()}
	numaByBusID := map[string]int{}
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		// The mock draws random UUIDs; a restarted plugin must find the GPUs it checkpointed.
		dev.UUID = simulatedUUID(node, profile, dev.Index)
		busID, err := normalisePCIBusID(dev.PciBusID)
		if err != nil {
			return nil, fmt.Errorf("simulated GPU %d of profile %s: %w", i, profile, err)
		}
		// Two CPU sockets, each with half of the GPUs, as on the DGX systems simulated here.
		numaByBusID[busID] = dev.Index * 2 / total
		if i < count {
			s.visible = append(s.visible, dev)
		}
	}
	s.installMocks()
	s.installRecoveryMocks()
	s.installMIGMocks()
	src, err := openNVML(srv, simulatedNUMA(numaByBusID))
	if err != nil {
		return nil, fmt.Errorf("simulated GPU profile %s: %w", profile, err)
	}
	s.src = src
	return s, nil
}

// installMocks sets the mock functions that the shared reader calls and go-nvml's mock server
// leaves unset or answers for all eight GPUs.
func (s *Simulated) installMocks() {
	s.server.DeviceGetCountFunc = func() (int, nvml.Return) {
		return len(s.visible), nvml.SUCCESS
	}
	s.server.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < 0 || i >= len(s.visible) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return s.visible[i], nvml.SUCCESS
	}
	// A GPU beyond count is not this node's: the mock would find it by UUID.
	s.server.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		for _, d := range s.visible {
			if d.UUID == uuid {
				return d, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	s.server.EventSetCreateFunc = s.events.create
	for _, dev := range s.visible {
		pci := simulatedPCIInfo(dev)
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pci, nvml.SUCCESS }
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return simulatedEventTypes, nvml.SUCCESS }
		dev.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
			return s.events.register(dev, types, set)
		}
		s.usage.installUsageMocks(dev)
	}
}

// Devices returns the simulated GPUs, sorted by index.
func (s *Simulated) Devices(ctx context.Context) ([]Device, error) {
	return s.src.Devices(ctx)
}

// WatchHealth sends the health changes that SetHealth injects until ctx ends; see Source.
func (s *Simulated) WatchHealth(ctx context.Context, events chan<- HealthEvent) error {
	return s.src.WatchHealth(ctx, events)
}

// Close ends pending event waits and shuts the mock NVML down.
func (s *Simulated) Close() error {
	s.events.close()
	return s.src.Close()
}

// SetHealth injects a health change, for tests and demonstrations: healthy=false with the XID
// that the GPU raised, or healthy=true with xid 0 to mark it healthy again. The XID goes through
// NVML's event path (an XID critical error event on the GPU's event sets), so it is classified
// exactly as a real one: an application XID such as 13 produces no health event at all.
//
// Unlike NVML, which drops events that no one waits for, an event for a GPU that no WatchHealth
// has registered yet is held until one does, so a caller need not wait for the watcher to start.
func (s *Simulated) SetHealth(uuid string, healthy bool, xid uint64) error {
	i := slices.IndexFunc(s.visible, func(d *server.Device) bool { return d.UUID == uuid })
	if i < 0 {
		return fmt.Errorf("set health of simulated GPU %s: no such GPU in profile %s with %d GPUs",
			uuid, s.profile, len(s.visible))
	}
	data := nvml.EventData{Device: s.visible[i], GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	switch {
	case healthy && xid != 0:
		return fmt.Errorf("set health of simulated GPU %s: healthy takes XID 0, not %d", uuid, xid)
	case healthy:
		data.EventType = eventTypeSimulatedRecovery
	case xid == 0:
		return fmt.Errorf("set health of simulated GPU %s: unhealthy needs the XID that caused it", uuid)
	default:
		data.EventType = nvml.EventTypeXidCriticalError
		data.EventData = xid
	}
	if err := s.events.deliver(s.visible[i], data); err != nil {
		return fmt.Errorf("set health of simulated GPU %s: %w", uuid, err)
	}
	return nil
}

// simulatedUUID derives a GPU UUID in NVML's format from the node, the profile and the index.
func simulatedUUID(node, profile string, index int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "vgpu-dra simulated GPU %s/%s/%d", node, profile, index))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}

// simulatedPCIInfo answers GetPciInfo as the driver does (the mock leaves the address empty):
// the mock's bus ID in NVML's spelling, 8-digit domain and upper case.
func simulatedPCIInfo(dev *server.Device) nvml.PciInfo {
	var domain, bus, device, function uint32
	// The mock formats PciBusID itself ("%04x:%02x:00.0"); NewSimulated has already parsed it.
	_, _ = fmt.Sscanf(dev.PciBusID, "%x:%x:%x.%x", &domain, &bus, &device, &function)
	info := nvml.PciInfo{Domain: domain, Bus: bus, Device: device, PciDeviceId: dev.Config.PciDeviceId}
	putCString(info.BusId[:], fmt.Sprintf("%08X:%02X:%02X.%X", domain, bus, device, function))
	putCString(info.BusIdLegacy[:], fmt.Sprintf("%04X:%02X:%02X.%X", domain, bus, device, function))
	return info
}

// simulatedNUMA looks NUMA nodes up in a fixed table instead of sysfs: the simulated PCI
// addresses are not this host's.
func simulatedNUMA(byBusID map[string]int) func(string) (*int, error) {
	return func(pciBusID string) (*int, error) {
		node, ok := byBusID[pciBusID]
		if !ok {
			return nil, nil
		}
		return &node, nil
	}
}

// putCString writes s into one of NVML's fixed char arrays, NUL-terminated and truncated to fit.
func putCString(dst []int8, s string) {
	n := min(len(s), len(dst)-1)
	for i := range n {
		dst[i] = int8(s[i])
	}
	dst[n] = 0
}
