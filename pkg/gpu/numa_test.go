package gpu

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// writeNUMA creates <root>/bus/pci/devices/<busID>/numa_node with content.
func writeNUMA(t *testing.T, root, busID, content string) {
	t.Helper()
	dir := filepath.Join(root, "bus", "pci", "devices", busID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSysfsNUMA(t *testing.T) {
	root := t.TempDir()
	writeNUMA(t, root, "0000:0f:00.0", "1\n")
	writeNUMA(t, root, "0000:10:00.0", "0\n")
	writeNUMA(t, root, "0000:11:00.0", "-1\n")
	writeNUMA(t, root, "0000:12:00.0", "two\n")
	if err := os.MkdirAll(filepath.Join(root, "bus", "pci", "devices", "0000:13:00.0", "numa_node"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		busID   string
		want    any // nil or int
		wantErr bool
	}{
		{"0000:0f:00.0", 1, false},
		{"0000:10:00.0", 0, false},
		{"0000:11:00.0", nil, false}, // kernel: no NUMA information
		{"0000:99:00.0", nil, false}, // no such device in sysfs
		{"0000:12:00.0", nil, true},  // unreadable content
		{"0000:13:00.0", nil, true},  // not a file
	}
	for _, tc := range cases {
		got, err := sysfsNUMA{root: root}.lookup(tc.busID)
		if (err != nil) != tc.wantErr || deref(got) != tc.want {
			t.Errorf("lookup(%s) = %v, %v; want %v, error %v", tc.busID, deref(got), err, tc.want, tc.wantErr)
		}
	}
}

// TestDevicesReadNUMAFromSysfs runs the inventory with the real source's NUMA reader over the
// simulated GPUs' bus IDs: known nodes are published, unknown and unreadable ones are nil.
func TestDevicesReadNUMAFromSysfs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root := t.TempDir()
	writeNUMA(t, root, "0000:00:00.0", "1\n")
	writeNUMA(t, root, "0000:01:00.0", "-1\n")
	writeNUMA(t, root, "0000:02:00.0", "garbage\n")
	sim := newTestSimulated(t, "dgx-h200", 4)
	sim.src.numa = sysfsNUMA{root: root}.lookup
	devs, err := sim.Devices(ctx)
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	want := []any{1, nil, nil, nil}
	for i, d := range devs {
		if deref(d.NUMANode) != want[i] {
			t.Errorf("GPU %d (%s) NUMA node = %v, want %v", i, d.PCIBusID, deref(d.NUMANode), want[i])
		}
	}
}
