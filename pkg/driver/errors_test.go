package driver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// TestHandleError: every error the helper reports is counted by severity; a recoverable one is
// only logged, an unrecoverable one tells OnFatal once, with the helper's words.
func TestHandleError(t *testing.T) {
	tests := []struct {
		name      string
		errs      []error
		wantFatal []string // what OnFatal is told, in order
		wantCount map[string]float64
	}{
		{name: "recoverable: logged and counted only",
			errs:      []error{fmt.Errorf("update ResourceSlice: conflict: %w", kubeletplugin.ErrRecoverable)},
			wantCount: map[string]float64{metrics.SeverityRecoverable: 1}},
		{name: "unrecoverable: the plugin must exit",
			errs:      []error{errors.New("accept unix dra.sock: use of closed network connection")},
			wantFatal: []string{"DRA helper: DRA gRPC server failed: accept unix dra.sock"},
			wantCount: map[string]float64{metrics.SeverityFatal: 1}},
		{name: "two unrecoverable errors: told once, both counted",
			errs:      []error{errors.New("first"), errors.New("second")},
			wantFatal: []string{"first"},
			wantCount: map[string]float64{metrics.SeverityFatal: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var told []string
			d := newTestDriver(t, func(_ *Config, deps *Deps) { deps.OnFatal = func(err error) { told = append(told, err.Error()) } })
			for _, err := range tt.errs {
				d.HandleError(context.Background(), err, "DRA gRPC server failed")
			}
			if len(told) != len(tt.wantFatal) {
				t.Fatalf("OnFatal told %q, want %d calls", told, len(tt.wantFatal))
			}
			for i := range told {
				if !strings.Contains(told[i], tt.wantFatal[i]) {
					t.Errorf("OnFatal told %q, want it to say %q", told[i], tt.wantFatal[i])
				}
			}
			for _, sev := range []string{metrics.SeverityRecoverable, metrics.SeverityFatal} {
				if got := d.metric(t, "vgpu_dra_helper_errors_total", "severity", sev); got != tt.wantCount[sev] {
					t.Errorf("helper_errors_total{severity=%s} = %v, want %v", sev, got, tt.wantCount[sev])
				}
			}
		})
	}
}
