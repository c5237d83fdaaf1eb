package featuregates

import (
	"strings"
	"testing"
)

func TestGates(t *testing.T) {
	tests := []struct {
		name      string
		set       string
		wantErr   string
		wantVGPU  bool
		wantNRI   bool
		wantCheck bool
	}{
		{name: "defaults", wantVGPU: true, wantNRI: true, wantCheck: true},
		{name: "NRI off", set: "NRISupport=false", wantVGPU: true, wantNRI: false, wantCheck: true},
		{name: "all off", set: "NRISupport=false,VGPUSupport=false,DeviceHealthCheck=false"},
		{name: "NRI needs VGPU", set: "VGPUSupport=false", wantErr: "VGPUSupport"},
		{name: "NRI explicitly on needs VGPU", set: "VGPUSupport=false,NRISupport=true", wantErr: "VGPUSupport"},
		{name: "unknown gate", set: "Nope=true", wantErr: "unrecognized feature gate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fg, err := New()
			if err != nil {
				t.Fatal(err)
			}
			if tc.set != "" {
				err = fg.Set(tc.set)
			}
			if err == nil {
				err = Validate(fg)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got := fg.Enabled(VGPUSupport); got != tc.wantVGPU {
				t.Errorf("VGPUSupport = %v, want %v", got, tc.wantVGPU)
			}
			if got := fg.Enabled(NRISupport); got != tc.wantNRI {
				t.Errorf("NRISupport = %v, want %v", got, tc.wantNRI)
			}
			if got := fg.Enabled(DeviceHealthCheck); got != tc.wantCheck {
				t.Errorf("DeviceHealthCheck = %v, want %v", got, tc.wantCheck)
			}
		})
	}
}
