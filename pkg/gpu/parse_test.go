package gpu

import (
	"context"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// fakeSource stands in for the real driver in ParseSource's dispatch test.
type fakeSource struct{ Source }

func TestParseSource(t *testing.T) {
	orig := newNVML
	t.Cleanup(func() { newNVML = orig })
	nvmlOpened := &fakeSource{}
	newNVML = func() (Source, error) { return nvmlOpened, nil }

	cases := []struct {
		spec        string
		wantProfile string // simulated: profile and GPU count
		wantCount   int
		wantNVML    bool
		wantErr     string
	}{
		{spec: "nvml", wantNVML: true},
		{spec: "simulated:dgx-h200", wantProfile: "dgx-h200", wantCount: 8},
		{spec: "simulated:dgx-a100:2", wantProfile: "dgx-a100", wantCount: 2},
		{spec: "simulated:dgx-h100:0", wantProfile: "dgx-h100", wantCount: 8},
		{spec: "simulated:dgx-b200:1", wantProfile: "dgx-b200", wantCount: 1},
		{spec: "", wantErr: `unknown GPU source ""`},
		{spec: "NVML", wantErr: `want "nvml" or "simulated:<profile>[:<count>]"`},
		{spec: "gpu", wantErr: `unknown GPU source "gpu"`},
		{spec: "nvml:0", wantErr: "nvml takes no arguments"},
		{spec: "simulated", wantErr: "profile one of dgx-a100, dgx-b200, dgx-h100, dgx-h200"},
		{spec: "simulated:", wantErr: "want simulated:<profile>[:<count>]"},
		{spec: "simulated:dgx-x", wantErr: `unknown simulated GPU profile "dgx-x": want one of dgx-a100, dgx-b200, dgx-h100, dgx-h200`},
		{spec: "simulated:dgx-h200:", wantErr: `count "" is not a whole number`},
		{spec: "simulated:dgx-h200:nine", wantErr: `count "nine" is not a whole number`},
		{spec: "simulated:dgx-h200:1:2", wantErr: `count "1:2" is not a whole number`},
		{spec: "simulated:dgx-h200:9", wantErr: "has 8 GPUs: count 9 not in 0..8"},
		{spec: "simulated:dgx-a100:-1", wantErr: "count -1 not in 0..8"},
	}
	for _, tc := range cases {
		t.Run(tc.spec, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			src, err := ParseSource(tc.spec, "node-a")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseSource(%q) error = %v, want %q", tc.spec, err, tc.wantErr)
				}
				if src != nil {
					t.Errorf("ParseSource(%q) returned a source with its error", tc.spec)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSource(%q): %v", tc.spec, err)
			}
			if tc.wantNVML {
				if src != Source(nvmlOpened) {
					t.Errorf("ParseSource(%q) = %T, want the NVML source", tc.spec, src)
				}
				return
			}
			t.Cleanup(func() { _ = src.Close() })
			sim, ok := src.(*Simulated)
			if !ok || sim.profile != tc.wantProfile {
				t.Fatalf("ParseSource(%q) = %#v, want simulated %s", tc.spec, src, tc.wantProfile)
			}
			if n := countDevices(ctx, t, sim); n != tc.wantCount {
				t.Errorf("ParseSource(%q) has %d GPUs, want %d", tc.spec, n, tc.wantCount)
			}
		})
	}
}

func countDevices(ctx context.Context, t *testing.T, src Source) int {
	t.Helper()
	devs, err := src.Devices(ctx)
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	return len(devs)
}
