package plugin

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// MIGAll selects every MIG-capable GPU of the node (--mig-gpus=all).
const MIGAll = "all"

// simulatedMIGStateName is the simulated GPUs' MIG state in the state dir: the instances a
// killed plugin made are there for the next one, as on a GPU.
const simulatedMIGStateName = "simulated-mig.json"

// parseMIGGPUs reads --mig-gpus: "" (none), "all", or NVML indexes separated by commas. It
// returns the indexes, nil for all.
func parseMIGGPUs(s string) (all bool, indexes []int, err error) {
	switch s {
	case "":
		return false, nil, nil
	case MIGAll:
		return true, nil, nil
	}
	for f := range strings.SplitSeq(s, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || i < 0 {
			return false, nil, fmt.Errorf("--mig-gpus %q: want \"all\" or GPU indexes separated by commas, not %q", s, f)
		}
		indexes = append(indexes, i)
	}
	return false, indexes, nil
}

// migLayouts reads what each MIG-managed GPU can be split into (contract §18). A GPU named by
// index that cannot be split is an error; with "all", such a GPU is left whole, with a log line.
func migLayouts(logger klog.Logger, cfg Config, src gpu.Source, devices []gpu.Device) (map[string]gpu.MIGLayout, gpu.MIG, error) {
	all, indexes, err := parseMIGGPUs(cfg.MIGGPUs)
	if err != nil || (!all && len(indexes) == 0) {
		return nil, nil, err
	}
	mig, ok := src.(gpu.MIG)
	if !ok {
		return nil, nil, fmt.Errorf("--mig-gpus: the GPU source %q cannot partition GPUs", cfg.DeviceSource)
	}
	if sim, ok := src.(*gpu.Simulated); ok {
		if err := sim.SetMIGStateFile(filepath.Join(cfg.StateDir, simulatedMIGStateName)); err != nil {
			return nil, nil, err
		}
	}
	for _, i := range indexes {
		if !slices.ContainsFunc(devices, func(g gpu.Device) bool { return g.Index == i }) {
			return nil, nil, fmt.Errorf("--mig-gpus: the node has no GPU %d", i)
		}
	}
	out := map[string]gpu.MIGLayout{}
	for _, g := range devices {
		if !all && !slices.Contains(indexes, g.Index) {
			continue
		}
		l, err := mig.MIGLayout(g.UUID)
		switch {
		case err == nil:
			out[g.UUID] = l
			logger.Info("GPU is MIG-managed: its partitions are published beside it", "index", g.Index, "uuid", g.UUID, "profiles", len(l.Profiles))
		case all && errors.Is(err, gpu.ErrMIGNotSupported):
			logger.Info("GPU cannot be partitioned: published whole only", "index", g.Index, "uuid", g.UUID)
		default:
			return nil, nil, fmt.Errorf("--mig-gpus: GPU %d: %w", g.Index, err)
		}
	}
	if len(out) == 0 {
		return nil, nil, nil
	}
	return out, mig, nil
}
