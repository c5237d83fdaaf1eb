package chartschema

import (
	"strings"
	"testing"
)

// TestSchemaMatchesValues: values.yaml and values.schema.json describe the same values. Every
// key of values.yaml is a property of the schema and every property of the schema a key of
// values.yaml, so the two cannot drift apart; every object whose keys the chart defines refuses
// other keys (a misspelt key fails at install, not when a pod fails); and the defaults meet the
// schema.
func TestSchemaMatchesValues(t *testing.T) {
	c := loadChart(t)
	var walk func(path string, values map[string]any, n map[string]any)
	walk = func(path string, values map[string]any, n map[string]any) {
		where := path
		if where == "" {
			where = "the top level"
		}
		if n["additionalProperties"] != false {
			t.Errorf("schema at %s: additionalProperties is %v, want false (a misspelt key must fail)", where, n["additionalProperties"])
		}
		props, _ := n["properties"].(map[string]any)
		for _, k := range sortedKeys(values) {
			if _, ok := props[k]; !ok {
				t.Errorf("values.yaml has %s, which values.schema.json does not describe", join(path, k))
			}
		}
		for _, k := range sortedKeys(props) {
			v, ok := values[k]
			if !ok {
				t.Errorf("values.schema.json describes %s, which values.yaml does not have", join(path, k))
				continue
			}
			child := c.resolve(props[k].(map[string]any))
			if child == nil {
				t.Errorf("values.schema.json: %s refers to a definition it does not have", join(path, k))
				continue
			}
			if !keyed(child) {
				continue
			}
			sub, ok := v.(map[string]any)
			if !ok {
				t.Errorf("values.yaml: %s is %s, the schema describes an object", join(path, k), asJSON(v))
				continue
			}
			walk(join(path, k), sub, child)
		}
	}
	walk("", c.values, c.schema)

	if err := c.validate(c.values); err != nil {
		t.Errorf("values.yaml's defaults do not meet values.schema.json:\n%v", err)
	}
}

// TestSchemaRefusesMistakes: values that the binaries or the templates refuse, and a misspelt
// key, are refused by the schema with a message naming the value.
func TestSchemaRefusesMistakes(t *testing.T) {
	c := loadChart(t)
	for _, tc := range []struct {
		path string
		v    any
		want string // in the message
	}{
		{"deviceSource", "bogus", "'/deviceSource': 'bogus'"},
		{"claimFSSize", "lots", "'/claimFSSize': 'lots'"},
		{"gpuInjection", "magic", "'/gpuInjection'"},
		{"mdoe", "dra", "'mdoe' not allowed"},
		{"enforce.coreMargin", 0, "'/enforce/coreMargin'"},
		{"webhook.tls.mode", "nope", "'/webhook/tls/mode'"},
		{"mode", "both", "'/mode'"},
		{"webhook.tls.certManager.renewbefore", "720h", "'renewbefore' not allowed"},
		{"featureGates.NRISuport", true, "'NRISuport' not allowed"},
		{"featureGates.VGPUSupport", false, "'/featureGates/VGPUSupport'"}, // NRISupport needs it
		{"usageInterval", 5, "'/usageInterval'"},                           // seconds? a duration has a unit
		{"nri.pluginIndex", "1", "'/nri/pluginIndex': '1'"},
		{"healthPort", 0, "'/healthPort'"},
		{"webhook.timeoutSeconds", 31, "'/webhook/timeoutSeconds'"},
		{"nodeSelector.gpu", true, "'/nodeSelector/gpu'"},
		{"tests.cores", 100, "'/tests/cores'"},           // the whole GPU: no core limit to check
		{"tests.memoryMiB", "1Gi", "'/tests/memoryMiB'"}, // MiB, a number the check computes with
		{"tests.memoryMiB", 0, "'/tests/memoryMiB'"},
		{"tests.comand", []any{"sh"}, "'comand' not allowed"},
		{"mig.gpus", "0;1", "'/mig/gpus'"}, // --mig-gpus takes commas
		{"mig.gpus", -1, "'/mig/gpus'"},
	} {
		err := c.validate(c.with(tc.path, tc.v))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%s: error %v, want one containing %q", tc.path, asJSON(tc.v), err, tc.want)
		}
	}
	for _, ok := range []any{"all", "0,1", 0, 3, ""} {
		if err := c.validate(c.with("mig.gpus", ok)); err != nil {
			t.Errorf("mig.gpus=%s: %v, want accepted", asJSON(ok), err)
		}
	}
	// The mistake the dependency guards against is only VGPUSupport off with NRISupport on.
	off := c.with("featureGates.VGPUSupport", false)
	off["featureGates"].(map[string]any)["NRISupport"] = false
	if err := c.validate(off); err != nil {
		t.Errorf("VGPUSupport and NRISupport both off: %v, want accepted", err)
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
