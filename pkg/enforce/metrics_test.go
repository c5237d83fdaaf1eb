package enforce

import (
	"slices"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// TestKillSeriesStartAtZero: every reason the enforcer kills for has its kill series at 0 from
// the start (pkg/metrics.KillReasons), so that the chart's VGPUEnforcerKilledProcesses, an
// increase() over them, fires at the first kill and not only at the second.
func TestKillSeriesStartAtZero(t *testing.T) {
	if want := []string{ReasonOverLimit, ReasonUnregistered, ReasonForeign}; !slices.Equal(metrics.KillReasons, want) {
		t.Errorf("metrics.KillReasons %v, want the enforcer's kill reasons %v", metrics.KillReasons, want)
	}
	reg := component.NewMetricsRegistry()
	metrics.NewEnforcementMetrics(reg)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "vgpu_dra_enforcement_actions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["action"] == ActionKill {
				got[labels["reason"]] = m.GetCounter().GetValue()
			}
		}
	}
	for _, reason := range []string{ReasonOverLimit, ReasonUnregistered, ReasonForeign} {
		if v, ok := got[reason]; !ok || v != 0 {
			t.Errorf("enforcement_actions_total{action=kill,reason=%s} = %v (present %v) before any kill, want 0", reason, v, ok)
		}
	}
}
