package driver

import (
	"os"
	"path/filepath"
	"testing"

	kmetrics "k8s.io/component-base/metrics"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// testDriver is a driver built by New over temp directories (claim directories without a
// tmpfs), two 80 GiB GPUs of node-1 and the NRI path.
type testDriver struct {
	*Driver
	reg kmetrics.KubeRegistry
}

func newTestDriver(t testing.TB, mutate ...func(*Config, *Deps)) *testDriver {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "vgd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	store, err := checkpoint.Open(filepath.Join(dir, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	writer, err := cdi.NewWriter(cdi.Options{DriverName: contract.DefaultDriverName, SpecDir: filepath.Join(dir, "cdi"),
		RegistryDir: filepath.Join(dir, "state", "registry"), VGPU: true, GPUInjection: cdi.InjectionNone})
	if err != nil {
		t.Fatal(err)
	}
	reg := kmetrics.NewKubeRegistry()
	cfg := Config{DriverName: contract.DefaultDriverName, NodeName: "node-1", VGPU: true, BootID: "boot"}
	deps := Deps{
		Devices:    []gpu.Device{{Index: 0, UUID: uuidGPU0, MemoryBytes: uint64(80 * gib), ProductName: "NVIDIA H100 80GB HBM3"}, {Index: 1, UUID: uuidGPU1, MemoryBytes: uint64(80 * gib), ProductName: "NVIDIA H100 80GB HBM3"}},
		Checkpoint: store, CDI: writer, Dirs: claimdir.Layout{StateDir: filepath.Join(dir, "state")},
		Metrics: metrics.New(reg), Paths: StaticPath(contract.PathNRI),
		NewUUID: func() string { return "00000000-0000-4000-8000-000000000001" },
	}
	for _, m := range mutate {
		m(&cfg, &deps)
	}
	d, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	return &testDriver{Driver: d, reg: reg}
}

// metric returns the value of the sample of name whose labels include label=value (any sample
// when label is empty); 0 when there is none.
func (d *testDriver) metric(t *testing.T, name, label, value string) float64 {
	t.Helper()
	families, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetName() == label && l.GetValue() == value
			}
			if match {
				return m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
