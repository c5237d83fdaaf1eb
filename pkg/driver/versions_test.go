package driver

import (
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

func TestSemverFromDotted(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "550.54.15", want: "550.54.15"},
		{in: "535.104.05", want: "535.104.5"}, // leading zero: the API would reject the slice
		{in: "570.86.10", want: "570.86.10"},
		{in: "470.57.02", want: "470.57.2"},
		{in: "9.0", want: "9.0.0"}, // compute capability
		{in: "12", want: "12.0.0"},
		{in: "08.00", want: "8.0.0"},
		{in: " 550.54.15\n", want: "550.54.15"},
		{in: "", wantErr: true},
		{in: "1.2.3.4", wantErr: true},
		{in: "550..15", wantErr: true},
		{in: "550.54.15-beta", wantErr: true},
		{in: "v550", wantErr: true},
		{in: "99999999999.0", wantErr: true},
	}
	for _, tc := range tests {
		got, err := semverFromDotted(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("semverFromDotted(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestSemverFromCUDA(t *testing.T) {
	tests := []struct {
		in      int
		want    string
		wantErr bool
	}{
		{in: 12040, want: "12.4.0"},
		{in: 12020, want: "12.2.0"},
		{in: 11080, want: "11.8.0"},
		{in: 13000, want: "13.0.0"},
		{in: 0, wantErr: true},
		{in: -1, wantErr: true},
	}
	for _, tc := range tests {
		got, err := semverFromCUDA(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("semverFromCUDA(%d) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestTaintValue(t *testing.T) {
	for in, want := range map[string]string{
		"XID 79 (GPU has fallen off the bus)": "XID-79-GPU-has-fallen-off-the-bus",
		"":                                    "",
		"--x--":                               "x",
	} {
		if got := taintValue(gpuEvent(in)); got != want {
			t.Errorf("taintValue(%q) = %q, want %q", in, got, want)
		}
	}
}

func gpuEvent(reason string) gpu.HealthEvent { return gpu.HealthEvent{Reason: reason} }
