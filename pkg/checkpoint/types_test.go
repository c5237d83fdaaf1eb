package checkpoint

import "testing"

// TestDeviceCeiling: what a share may burst to (contract §16) — its configured ceiling, never
// below its request; without one, its request for a guaranteed share and the whole GPU for a
// best-effort one. An empty class (a device prepared before classes existed) is guaranteed.
func TestDeviceCeiling(t *testing.T) {
	tests := []struct {
		name       string
		dev        Device
		want       int64
		bestEffort bool
	}{
		{"guaranteed, no ceiling: no burst", Device{Cores: 30, Class: "Guaranteed"}, 30, false},
		{"no class: guaranteed", Device{Cores: 30}, 30, false},
		{"guaranteed with a ceiling", Device{Cores: 30, Class: "Guaranteed", CoresCeiling: 70}, 70, false},
		{"a ceiling below the request: the request", Device{Cores: 30, CoresCeiling: 20}, 30, false},
		{"best-effort, no ceiling: the whole GPU", Device{Cores: 10, Class: "BestEffort"}, 100, true},
		{"best-effort with a ceiling", Device{Cores: 10, Class: "BestEffort", CoresCeiling: 40}, 40, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.dev.Ceiling(); got != tt.want {
				t.Errorf("Ceiling() = %d, want %d", got, tt.want)
			}
			if got := tt.dev.BestEffort(); got != tt.bestEffort {
				t.Errorf("BestEffort() = %v, want %v", got, tt.bestEffort)
			}
		})
	}
}
