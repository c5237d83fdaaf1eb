// Package chartschema checks the chart's values.schema.json against values.yaml, the chart's
// README and what the binaries accept, without helm: Helm validates values with
// santhosh-tekuri/jsonschema, and these tests compile the schema with the same library the same
// way (helm.sh/helm/v3 pkg/chartutil ValidateAgainstSingleSchema). The cluster suites' hack/e2e.sh
// proves with helm itself that the schema is in force.
package chartschema

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"sigs.k8s.io/yaml"
)

var chartDir = filepath.Join("..", "..", "deployments", "helm", "vgpu-dra")

// schemaURL is the name Helm compiles a chart's schema under.
const schemaURL = "file:///values.schema.json"

// chart is the chart's values.yaml and values.schema.json, as Helm reads them.
type chart struct {
	// values are values.yaml's defaults, decoded as Helm's validator sees them (JSON numbers).
	values map[string]any
	// schema is values.schema.json as a document, for walking it.
	schema map[string]any
	// validator is the compiled schema.
	validator *jsonschema.Schema
}

func loadChart(t *testing.T) chart {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	values, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	raw, err = os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	compiler := jsonschema.NewCompiler()
	if err := compiler.AddResource(schemaURL, doc); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	validator, err := compiler.Compile(schemaURL)
	if err != nil {
		t.Fatalf("compile values.schema.json: %v", err)
	}
	return chart{values: values.(map[string]any), schema: doc.(map[string]any), validator: validator}
}

// validate checks values against the schema; nil when they meet it.
func (c chart) validate(values map[string]any) error {
	return c.validator.Validate(values)
}

// with returns a copy of the defaults with the value at path (dotted, "enforce.coreMargin")
// replaced by v, as `helm --set` would; a missing map on the way is created.
func (c chart) with(path string, v any) map[string]any {
	out := deepCopy(c.values).(map[string]any)
	m, keys := out, strings.Split(path, ".")
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[keys[len(keys)-1]] = v
	return out
}

func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := maps.Clone(v)
		for k, e := range out {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = deepCopy(e)
		}
		return out
	}
	return v
}

// node is the schema at path ("" for the root, "webhook.tls" for a nested value), its $ref
// followed; nil when the schema has no such property.
func (c chart) node(path string) map[string]any {
	n := c.schema
	if path == "" {
		return n
	}
	for _, k := range strings.Split(path, ".") {
		props, _ := n["properties"].(map[string]any)
		child, ok := props[k].(map[string]any)
		if !ok {
			return nil
		}
		n = c.resolve(child)
	}
	return n
}

// resolve follows a local $ref ("#/definitions/<name>").
func (c chart) resolve(n map[string]any) map[string]any {
	ref, ok := n["$ref"].(string)
	if !ok {
		return n
	}
	defs, _ := c.schema["definitions"].(map[string]any)
	def, _ := defs[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any)
	return def
}

// keyed says whether the schema defines the keys of the object at this node (as opposed to a
// free-form object such as resources or nodeSelector).
func keyed(n map[string]any) bool {
	_, ok := n["properties"]
	return ok
}

// leaves are the values a user sets: every value of values.yaml under the objects whose keys
// the chart defines, a free-form object (resources, nodeSelector) counting as one value.
func (c chart) leaves() []string {
	var out []string
	var walk func(prefix string, values map[string]any)
	walk = func(prefix string, values map[string]any) {
		for _, k := range sortedKeys(values) {
			path := strings.TrimPrefix(prefix+"."+k, ".")
			if sub, ok := values[k].(map[string]any); ok {
				if n := c.node(path); n != nil && keyed(n) {
					walk(path, sub)
					continue
				}
			}
			out = append(out, path)
		}
	}
	walk("", c.values)
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// asJSON is v as JSON, for messages.
func asJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return "?"
	}
	return string(b)
}
