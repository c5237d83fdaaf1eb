package integration

import (
	"testing"
)

// counterValue reads one labelled sample of a metric from the plugin's registry, as a scrape would.
func counterValue(t *testing.T, n *node, name, label, value string) float64 {
	t.Helper()
	families, err := n.plugin.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if m.GetCounter() != nil {
						return m.GetCounter().GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// gaugeValue reads an unlabelled gauge.
func gaugeValue(t *testing.T, n *node, name string) float64 {
	t.Helper()
	families, err := n.plugin.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}
