package gpu

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"k8s.io/klog/v2/ktesting"
)

// mockDevice returns the go-nvml mock device behind simulated GPU position i.
func mockDevice(s *Simulated, i int) *server.Device {
	return s.server.Devices[i].(*server.Device)
}

func TestSimulatedDevices(t *testing.T) {
	profiles := []struct {
		profile, product, arch, cc, driver string
		cuda                               int
		memMiB                             uint64
	}{
		{"dgx-h200", "NVIDIA H200 141GB HBM3e", "Hopper", "9.0", "550.54.15", 12040, 144384},
		{"dgx-a100", "Mock NVIDIA A100-SXM4-40GB", "Ampere", "8.0", "550.54.15", 12040, 40960},
		{"dgx-h100", "NVIDIA H100 80GB HBM3", "Hopper", "9.0", "550.54.15", 12040, 81920},
		{"dgx-b200", "NVIDIA B200 180GB HBM3e", "Blackwell", "10.0", "560.28.03", 12060, 184320},
	}
	uuidFormat := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	for _, p := range profiles {
		for _, count := range []int{1, 2, 8} {
			t.Run(fmt.Sprintf("%s/%d", p.profile, count), func(t *testing.T) {
				_, ctx := ktesting.NewTestContext(t)
				sim, err := NewSimulated(p.profile, count, "node-a")
				if err != nil {
					t.Fatalf("NewSimulated: %v", err)
				}
				t.Cleanup(func() { _ = sim.Close() })
				got, err := sim.Devices(ctx)
				if err != nil {
					t.Fatalf("Devices: %v", err)
				}
				if len(got) != count {
					t.Fatalf("got %d devices, want %d", len(got), count)
				}
				for i, d := range got {
					m := mockDevice(sim, i)
					node := i / 4
					want := Device{
						Index:                 m.Index,
						UUID:                  m.UUID,
						MemoryBytes:           m.MemoryInfo.Total,
						ProductName:           m.Config.Name,
						Brand:                 "Nvidia",
						Architecture:          p.arch,
						CUDAComputeCapability: fmt.Sprintf("%d.%d", m.Config.CudaMajor, m.Config.CudaMinor),
						DriverVersion:         sim.server.DriverVersion,
						CUDADriverVersion:     sim.server.CudaDriverVersion,
						PCIBusID:              m.PciBusID,
						NUMANode:              &node,
					}
					if !reflect.DeepEqual(d, want) {
						t.Errorf("device %d:\n got %+v (NUMA %v)\nwant %+v (NUMA %v)", i, d, deref(d.NUMANode), want, node)
					}
					// The mock's values are the ones a user would see; pin them too.
					if d.Index != i || d.ProductName != p.product || d.MemoryBytes != p.memMiB<<20 ||
						d.CUDAComputeCapability != p.cc || d.DriverVersion != p.driver || d.CUDADriverVersion != p.cuda ||
						d.PCIBusID != fmt.Sprintf("0000:%02x:00.0", i) || !uuidFormat.MatchString(d.UUID) {
						t.Errorf("device %d = %+v, not the %s mock's", i, d, p.profile)
					}
				}
			})
		}
	}
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestSimulatedIsDeterministic(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	read := func(profile, node string) []Device {
		sim, err := NewSimulated(profile, 0, node)
		if err != nil {
			t.Fatalf("NewSimulated(%s, %s): %v", profile, node, err)
		}
		defer func() { _ = sim.Close() }()
		devs, err := sim.Devices(ctx)
		if err != nil {
			t.Fatalf("Devices: %v", err)
		}
		return devs
	}
	first, second := read("dgx-h200", testNode), read("dgx-h200", testNode)
	if !reflect.DeepEqual(first, second) {
		t.Errorf("two simulated dgx-h200 on one node differ:\n%+v\n%+v", first, second)
	}
	// Every GPU of every node and profile has a UUID of its own: 50 nodes of 8 GPUs, as the
	// issue measured (401 devices and 8 distinct UUIDs while UUIDs ignored the node).
	seen := map[string]string{}
	for _, profile := range []string{"dgx-h200", "dgx-a100"} {
		for n := range 50 {
			node := fmt.Sprintf("node-%d", n)
			for _, d := range read(profile, node) {
				where := fmt.Sprintf("%s %s gpu-%d", node, profile, d.Index)
				if other, dup := seen[d.UUID]; dup {
					t.Fatalf("UUID %s of %s is also %s's", d.UUID, where, other)
				}
				seen[d.UUID] = where
			}
		}
	}
	// Pinned: checkpoints of running simulated clusters name GPUs by this UUID.
	if want := "GPU-495773ed-6f51-4f2f-849c-fdea72956898"; first[0].UUID != want {
		t.Errorf("UUID of dgx-h200 GPU 0 on %s = %s, want %s", testNode, first[0].UUID, want)
	}
	if _, err := NewSimulated("dgx-h200", 1, ""); err == nil || !strings.Contains(err.Error(), "node's name") {
		t.Errorf("NewSimulated without a node name: %v, want an error that asks for it", err)
	}
}

// testNode is the node the simulated sources of these tests run on.
const testNode = "node-a"

func TestDevicesSortedByIndex(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	sim := newTestSimulated(t, "dgx-h200", 8)
	// NVML may enumerate in any order; the inventory must not depend on it.
	sim.server.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		return sim.visible[len(sim.visible)-1-i], nvml.SUCCESS
	}
	devs, err := sim.Devices(ctx)
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	for i, d := range devs {
		if d.Index != i || d.UUID != sim.visible[i].UUID {
			t.Errorf("position %d holds index %d (%s)", i, d.Index, d.UUID)
		}
	}
}

func TestDevicesNVMLErrors(t *testing.T) {
	fail := nvml.ERROR_UNKNOWN
	cases := []struct {
		name    string
		inject  func(s *server.Server, d *server.Device)
		wantMsg string
	}{
		{"driver version", func(s *server.Server, _ *server.Device) {
			s.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "", fail }
		}, "read NVIDIA driver version"},
		{"CUDA version", func(s *server.Server, _ *server.Device) {
			s.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) { return 0, fail }
		}, "read CUDA driver version"},
		{"count", func(s *server.Server, _ *server.Device) {
			s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, fail }
		}, "count GPUs"},
		{"handle", func(s *server.Server, _ *server.Device) {
			s.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, fail }
		}, "open GPU 0"},
		{"index", func(_ *server.Server, d *server.Device) {
			d.GetIndexFunc = func() (int, nvml.Return) { return 0, fail }
		}, "read index of GPU 1"},
		{"UUID", func(_ *server.Server, d *server.Device) {
			d.GetUUIDFunc = func() (string, nvml.Return) { return "", fail }
		}, "read UUID of GPU 1"},
		{"name", func(_ *server.Server, d *server.Device) {
			d.GetNameFunc = func() (string, nvml.Return) { return "", fail }
		}, "read product name of GPU 1"},
		{"brand", func(_ *server.Server, d *server.Device) {
			d.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return 0, fail }
		}, "read brand of GPU 1"},
		{"architecture", func(_ *server.Server, d *server.Device) {
			d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return 0, fail }
		}, "read architecture of GPU 1"},
		{"compute capability", func(_ *server.Server, d *server.Device) {
			d.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return 0, 0, fail }
		}, "read CUDA compute capability of GPU 1"},
		{"memory", func(_ *server.Server, d *server.Device) {
			d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, fail }
		}, "read memory size of GPU 1"},
		{"PCI", func(_ *server.Server, d *server.Device) {
			d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, fail }
		}, "read PCI address of GPU 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			sim := newTestSimulated(t, "dgx-a100", 2)
			tc.inject(sim.server, sim.visible[1])
			_, err := sim.Devices(ctx)
			if !errors.Is(err, fail) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("Devices error = %v, want %q wrapping %v", err, tc.wantMsg, fail)
			}
		})
	}
}

func TestDevicesMalformedPCIBusID(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	sim := newTestSimulated(t, "dgx-a100", 1)
	sim.visible[0].GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.SUCCESS }
	if _, err := sim.Devices(ctx); !errors.Is(err, errBadPCIBusID) {
		t.Errorf("Devices error = %v, want %v", err, errBadPCIBusID)
	}
}

func TestDevicesUnknownBrandAndArchitecture(t *testing.T) {
	cases := []struct {
		name        string
		brand       nvml.BrandType
		arch        nvml.DeviceArchitecture
		ret         nvml.Return
		wantBrand   string
		wantArchStr string
	}{
		{"not supported", 0, 0, nvml.ERROR_NOT_SUPPORTED, "Unknown", "Unknown"},
		{"older library", 0, 0, nvml.ERROR_FUNCTION_NOT_FOUND, "Unknown", "Unknown"},
		{"values newer than the tables", nvml.BRAND_COUNT, nvml.DEVICE_ARCH_UNKNOWN, nvml.SUCCESS, "Unknown", "Unknown"},
		{"Tesla Volta", nvml.BRAND_TESLA, nvml.DEVICE_ARCH_VOLTA, nvml.SUCCESS, "Tesla", "Volta"},
		{"GeForce RTX Ada", nvml.BRAND_GEFORCE_RTX, nvml.DEVICE_ARCH_ADA, nvml.SUCCESS, "GeForceRTX", "Ada Lovelace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			sim := newTestSimulated(t, "dgx-h200", 1)
			sim.visible[0].GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return tc.brand, tc.ret }
			sim.visible[0].GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return tc.arch, tc.ret }
			devs, err := sim.Devices(ctx)
			if err != nil {
				t.Fatalf("Devices: %v", err)
			}
			if devs[0].Brand != tc.wantBrand || devs[0].Architecture != tc.wantArchStr {
				t.Errorf("brand, architecture = %q, %q; want %q, %q", devs[0].Brand, devs[0].Architecture, tc.wantBrand, tc.wantArchStr)
			}
		})
	}
}

func TestNormalisePCIBusID(t *testing.T) {
	cases := []struct{ in, want string }{
		{"00000000:0F:00.0", "0000:0f:00.0"},
		{"0000:0f:00.0", "0000:0f:00.0"},
		{"00000001:BD:1F.7", "0001:bd:1f.7"},
		{"0001C3A4:00:00.0", "1c3a4:00:00.0"}, // Hyper-V style wide domain: sysfs keeps every digit
		{"", ""},
		{"0000:0f:00", ""},
		{"0000:0f.00.0", ""},
		{"0000:100:00.0", ""},
		{"0000:0f:20.0", ""},
		{"0000:0f:00.8", ""},
		{"zz:0f:00.0", ""},
		{"100000000:0f:00.0", ""},
	}
	for _, tc := range cases {
		got, err := normalisePCIBusID(tc.in)
		if tc.want == "" {
			if !errors.Is(err, errBadPCIBusID) {
				t.Errorf("normalisePCIBusID(%q) = %q, %v; want %v", tc.in, got, err, errBadPCIBusID)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("normalisePCIBusID(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestCStrings(t *testing.T) {
	var buf [8]int8
	putCString(buf[:], "0000:0f:00.0")
	if got := cString(buf[:]); got != "0000:0f" {
		t.Errorf("truncated round trip = %q, want %q", got, "0000:0f")
	}
	putCString(buf[:], "ab")
	if got := cString(buf[:]); got != "ab" {
		t.Errorf("round trip = %q, want %q", got, "ab")
	}
}

func TestNamesCoverEveryKnownValue(t *testing.T) {
	for b := nvml.BrandType(1); b < nvml.BRAND_NVIDIA_DLA; b++ {
		if brandName(b) == unknownName {
			t.Errorf("brand %d has no name", b)
		}
	}
	for a := nvml.DeviceArchitecture(nvml.DEVICE_ARCH_KEPLER); a <= nvml.DEVICE_ARCH_BLACKWELL; a++ {
		if architectureName(a) == unknownName {
			t.Errorf("architecture %d has no name", a)
		}
	}
	if brandName(nvml.BRAND_UNKNOWN) != unknownName || architectureName(nvml.DEVICE_ARCH_UNKNOWN) != unknownName {
		t.Errorf("NVML's unknown values must read %q", unknownName)
	}
}

// newTestSimulated opens a simulated source that the test closes.
func newTestSimulated(t *testing.T, profile string, count int) *Simulated {
	t.Helper()
	sim, err := NewSimulated(profile, count, testNode)
	if err != nil {
		t.Fatalf("NewSimulated(%s, %d): %v", profile, count, err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	return sim
}
