package gpu

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// hostSysfsRoot is where the real source reads the kernel's PCI view.
const hostSysfsRoot = "/sys"

// sysfsNUMA reads a PCI device's NUMA node from <root>/bus/pci/devices/<bus id>/numa_node.
type sysfsNUMA struct {
	root string
}

// lookup returns the NUMA node, or nil when the kernel does not know it: it writes -1 on
// machines without NUMA, and a device that is not in sysfs (a container without /sys) has no
// file at all.
func (n sysfsNUMA) lookup(pciBusID string) (*int, error) {
	path := filepath.Join(n.root, "bus", "pci", "devices", pciBusID, "numa_node")
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read NUMA node of PCI device %s: %w", pciBusID, err)
	}
	node, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return nil, fmt.Errorf("parse NUMA node of PCI device %s from %s: %w", pciBusID, path, err)
	}
	if node < 0 {
		return nil, nil
	}
	return &node, nil
}
