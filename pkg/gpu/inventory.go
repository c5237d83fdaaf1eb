package gpu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// nvmlSource is the one reader of NVML, behind both the real and the simulated source: the
// simulated source differs only in the nvml.Interface it passes in (and in where NUMA nodes
// come from, since its PCI addresses do not exist in this host's sysfs).
type nvmlSource struct {
	lib nvml.Interface
	// numa looks up the NUMA node of a normalised PCI bus ID; nil result = unknown.
	numa func(pciBusID string) (*int, error)
	// health holds the timings of WatchHealth; tests shorten them.
	health healthTimings

	closeOnce sync.Once
	closeErr  error
}

// healthTimings are WatchHealth's waits.
type healthTimings struct {
	// wait bounds one NVML event wait: the longest WatchHealth takes to see ctx end.
	wait time.Duration
	// retryMin and retryMax bound the backoff between attempts after an NVML error.
	retryMin, retryMax time.Duration
	// xidQuiet is how long a GPU made unhealthy by an XID outside both lists (xid.go), while
	// NVML's recovery action stays none, must see no further such XID to be healthy again;
	// 0: such a GPU stays unhealthy until it is marked healthy or the plugin restarts.
	xidQuiet time.Duration
}

// DefaultXIDQuietPeriod is healthTimings.xidQuiet's default.
const DefaultXIDQuietPeriod = 5 * time.Minute

var defaultHealthTimings = healthTimings{wait: time.Second, retryMin: time.Second, retryMax: 30 * time.Second, xidQuiet: DefaultXIDQuietPeriod}

// Devices returns every GPU, sorted by index.
func (s *nvmlSource) Devices(ctx context.Context) ([]Device, error) {
	driverVersion, ret := s.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("read NVIDIA driver version: %w", ret)
	}
	cudaVersion, ret := s.lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("read CUDA driver version: %w", ret)
	}
	count, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count GPUs: %w", ret)
	}
	devices := make([]Device, 0, count)
	for i := range count {
		d, err := s.readDevice(ctx, i)
		if err != nil {
			return nil, err
		}
		d.DriverVersion = driverVersion
		d.CUDADriverVersion = cudaVersion
		devices = append(devices, d)
	}
	slices.SortFunc(devices, func(a, b Device) int { return a.Index - b.Index })
	return devices, nil
}

// readDevice reads the GPU that NVML enumerates at position i.
func (s *nvmlSource) readDevice(ctx context.Context, i int) (Device, error) {
	dev, ret := s.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("open GPU %d: %w", i, ret)
	}
	var d Device
	if d.Index, ret = dev.GetIndex(); ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("read index of GPU %d: %w", i, ret)
	}
	if d.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("read UUID of GPU %d: %w", i, ret)
	}
	if d.ProductName, ret = dev.GetName(); ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("read product name of GPU %d: %w", i, ret)
	}
	brand, ret := dev.GetBrand()
	if d.Brand, ret = optionalName(ret, brandName(brand)); ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("read brand of GPU %d: %w", i, ret)
	}
	arch, ret := dev.GetArchitecture()
	if d.Architecture, ret = optionalName(ret, architectureName(arch)); ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("read architecture of GPU %d: %w", i, ret)
	}
	major, minor, ret := dev.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("read CUDA compute capability of GPU %d: %w", i, ret)
	}
	d.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("read memory size of GPU %d: %w", i, ret)
	}
	d.MemoryBytes = mem.Total
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("read PCI address of GPU %d: %w", i, ret)
	}
	busID, err := normalisePCIBusID(cString(pci.BusId[:]))
	if err != nil {
		return Device{}, fmt.Errorf("read PCI address of GPU %d: %w", i, err)
	}
	d.PCIBusID = busID
	d.NUMANode = s.numaNode(ctx, d)
	return d, nil
}

// optionalName treats "this driver or GPU cannot say" as an unknown name rather than an error:
// brand and architecture are descriptive attributes, not worth losing the GPU over.
func optionalName(ret nvml.Return, name string) (string, nvml.Return) {
	switch ret {
	case nvml.SUCCESS:
		return name, ret
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		return unknownName, nvml.SUCCESS
	default:
		return "", ret
	}
}

// numaNode is best effort: a NUMA node that cannot be read is published as unknown, with a log
// line, rather than failing the whole inventory.
func (s *nvmlSource) numaNode(ctx context.Context, d Device) *int {
	node, err := s.numa(d.PCIBusID)
	if err != nil {
		klog.FromContext(ctx).Error(err, "NUMA node of GPU unknown", "index", d.Index, "uuid", d.UUID)
		return nil
	}
	return node
}

// Close shuts NVML down; later calls return the first call's result.
func (s *nvmlSource) Close() error {
	s.closeOnce.Do(func() {
		if ret := s.lib.Shutdown(); ret != nvml.SUCCESS {
			s.closeErr = fmt.Errorf("shut down NVML: %w", ret)
		}
	})
	return s.closeErr
}

// errBadPCIBusID is wrapped by normalisePCIBusID's errors.
var errBadPCIBusID = errors.New("malformed PCI bus ID")

// normalisePCIBusID turns NVML's "00000000:0F:00.0" into sysfs's "0000:0f:00.0": lower case,
// domain with at least 4 digits (NVML prints 8), bus and device with 2, function with 1.
func normalisePCIBusID(id string) (string, error) {
	domain, rest, ok1 := strings.Cut(id, ":")
	bus, rest, ok2 := strings.Cut(rest, ":")
	dev, fn, ok3 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 {
		return "", fmt.Errorf("%w %q: want domain:bus:device.function", errBadPCIBusID, id)
	}
	var vals [4]uint64
	for i, f := range []struct {
		s    string
		bits int
	}{{domain, 32}, {bus, 8}, {dev, 5}, {fn, 3}} {
		v, err := strconv.ParseUint(f.s, 16, f.bits)
		if err != nil {
			return "", fmt.Errorf("%w %q: %w", errBadPCIBusID, id, err)
		}
		vals[i] = v
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", vals[0], vals[1], vals[2], vals[3]), nil
}

// cString reads a NUL-terminated C string out of one of NVML's fixed char arrays.
func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}
