package enforce

import (
	"context"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// simulatedGPUs is count simulated H200s of node name, and their UUIDs; closed at the end of tb.
func simulatedGPUs(tb testing.TB, count int, name string) (*gpu.Simulated, []string) {
	tb.Helper()
	sim, err := gpu.NewSimulated("dgx-h200", count, name)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = sim.Close() })
	devs, err := sim.Devices(context.Background())
	if err != nil || len(devs) != count {
		tb.Fatalf("simulated GPUs: %v, %v; want %d", devs, err, count)
	}
	uuids := make([]string, len(devs))
	for i, d := range devs {
		uuids[i] = d.UUID
	}
	return sim, uuids
}
