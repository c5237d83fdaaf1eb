package chartschema

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/featuregates"
)

// TestSchemaAcceptsWhatTheBinariesAccept: for each value with a syntax or a range, the schema
// accepts a sample exactly when the binaries that the chart passes it to accept it as the chart
// renders it, but for the differences listed, each with its reason (the schema stricter on
// quirks of a parser that mean 0 or the default, looser on a bound only the binary checks).
func TestSchemaAcceptsWhatTheBinariesAccept(t *testing.T) {
	c := loadChart(t)
	for _, tc := range parityCases() {
		if c.node(tc.path) == nil {
			t.Errorf("values.schema.json has no %s", tc.path)
			continue
		}
		// Every value an enum names is a sample: one the binaries do not know fails.
		samples := tc.samples
		if enum, ok := c.node(tc.path)["enum"].([]any); ok {
			samples = append(slices.Clone(samples), enum...)
		}
		for _, v := range samples {
			binErr := tc.binary(fmt.Sprint(v))
			schemaErr := c.validate(c.with(tc.path, v))
			if why, ok := tc.differs[asJSON(v)]; ok {
				if (binErr == nil) == (schemaErr == nil) {
					t.Errorf("%s=%s is listed as a difference (%s), but the binaries and the schema agree (binaries: %v)", tc.path, asJSON(v), why, binErr)
				}
				continue
			}
			if (binErr == nil) != (schemaErr == nil) {
				t.Errorf("%s=%s: the binaries say %v; the schema says %v", tc.path, asJSON(v), orAccepted(binErr), orAccepted(schemaErr))
			}
		}
	}
}

// TestSchemaTakesTheBinariesFeatureGates: featureGates takes each gate the binaries know (the
// chart's three and component-base's logging gates) and no other, and refuses NRISupport on with
// VGPUSupport off, as the binaries do; the chart renders the map as --feature-gates=k=v,...
func TestSchemaTakesTheBinariesFeatureGates(t *testing.T) {
	c := loadChart(t)
	fg, err := featuregates.New()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for gate := range fg.GetAll() {
		names = append(names, string(gate))
	}
	// And every gate the schema names, so that it names none the binaries do not know.
	schemaGates := c.node("featureGates")
	names = append(names, sortedKeys(schemaGates["properties"].(map[string]any))...)
	for pattern := range schemaGates["patternProperties"].(map[string]any) {
		names = append(names, strings.Split(strings.Trim(pattern, "^()$"), "|")...)
	}
	slices.Sort(names)
	binary := sharedFlag("feature-gates")
	for _, name := range append(slices.Compact(names), "NRISuport", "vgpusupport", "Bogus") {
		for _, on := range []bool{true, false} {
			values := c.with("featureGates."+name, on)
			gates := values["featureGates"].(map[string]any)
			rendered := renderGates(gates)
			binErr, schemaErr := binary(rendered), c.validate(values)
			if (binErr == nil) != (schemaErr == nil) {
				t.Errorf("featureGates %s: the binaries say %v; the schema says %v", rendered, orAccepted(binErr), orAccepted(schemaErr))
			}
		}
	}
	off := c.with("featureGates.VGPUSupport", false)
	for _, nri := range []bool{true, false} {
		off["featureGates"].(map[string]any)["NRISupport"] = nri
		rendered := renderGates(off["featureGates"].(map[string]any))
		if binErr, schemaErr := binary(rendered), c.validate(off); (binErr == nil) != (schemaErr == nil) {
			t.Errorf("featureGates %s: the binaries say %v; the schema says %v", rendered, orAccepted(binErr), orAccepted(schemaErr))
		}
	}
}

// renderGates is the chart's vgpu-dra.featureGates helper: k=v, sorted by k, joined by commas.
func renderGates(gates map[string]any) string {
	var out []string
	for _, k := range sortedKeys(gates) {
		out = append(out, fmt.Sprintf("%s=%t", k, gates[k]))
	}
	return strings.Join(out, ",")
}

func orAccepted(err error) string {
	if err == nil {
		return "accepted"
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}
