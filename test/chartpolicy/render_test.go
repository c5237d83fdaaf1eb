package chartpolicy

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"text/template"

	"sigs.k8s.io/yaml"
)

// The release the chart is rendered for.
const (
	releaseName      = "vgpu-dra"
	releaseNamespace = "vgpu-dra"
)

var chartDir = filepath.Join("..", "..", "deployments", "helm", "vgpu-dra")

// renderTemplate renders one of the chart's templates with the chart's values.yaml and
// _helpers.tpl, as `helm template --set` would for the templates this package tests, and returns
// its YAML documents. set overrides values by dotted path ("metrics.auth"). It knows only the
// template functions the chart's helpers and those templates use (the cluster suites render the
// whole chart with helm itself).
func renderTemplate(t *testing.T, name string, set map[string]any) []string {
	t.Helper()
	var values map[string]any
	mustUnmarshalFile(t, filepath.Join(chartDir, "values.yaml"), &values)
	for path, v := range set {
		m, keys := values, strings.Split(path, ".")
		for _, k := range keys[:len(keys)-1] {
			m = m[k].(map[string]any)
		}
		m[keys[len(keys)-1]] = v
	}
	var chart map[string]any
	mustUnmarshalFile(t, filepath.Join(chartDir, "Chart.yaml"), &chart)

	root := template.New("chart")
	root.Funcs(templateFuncs(root))
	for _, file := range []string{filepath.Join("templates", "_helpers.tpl"), filepath.Join("templates", name)} {
		text, err := os.ReadFile(filepath.Join(chartDir, file))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := root.New(file).Parse(string(text)); err != nil {
			t.Fatalf("parse %s: %v", file, err)
		}
	}
	data := map[string]any{
		"Values":  values,
		"Release": map[string]any{"Name": releaseName, "Namespace": releaseNamespace, "Service": "Helm"},
		"Chart":   map[string]any{"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]},
	}
	var out bytes.Buffer
	if err := root.ExecuteTemplate(&out, filepath.Join("templates", name), data); err != nil {
		t.Fatalf("render %s: %v", name, err)
	}
	var docs []string
	for _, doc := range strings.Split(out.String(), "\n---\n") {
		if strings.TrimSpace(doc) != "" {
			docs = append(docs, doc)
		}
	}
	return docs
}

func mustUnmarshalFile(t *testing.T, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// templateFuncs are Helm's include and the Sprig functions the helpers use, with Helm's meaning.
func templateFuncs(root *template.Template) template.FuncMap {
	return template.FuncMap{
		"include": func(name string, data any) (string, error) {
			var b bytes.Buffer
			err := root.ExecuteTemplate(&b, name, data)
			return b.String(), err
		},
		"fail":       func(msg string) (string, error) { return "", errors.New(msg) },
		"quote":      func(s any) string { return fmt.Sprintf("%q", fmt.Sprint(s)) },
		"indent":     func(n int, s string) string { return indent(n, s) },
		"nindent":    func(n int, s string) string { return "\n" + indent(n, s) },
		"trunc":      func(n int, s string) string { return s[:min(n, len(s))] },
		"trimSuffix": func(suffix, s string) string { return strings.TrimSuffix(s, suffix) },
		"list":       func(v ...any) []any { return v },
		"int":        toInt,
		"sha256sum":  func(s string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(s))) },
		"has": func(needle any, haystack []any) bool {
			for _, v := range haystack {
				if reflect.DeepEqual(v, needle) {
					return true
				}
			}
			return false
		},
		"default": func(def, v any) any {
			if v == nil || reflect.ValueOf(v).IsZero() {
				return def
			}
			return v
		},
		"dict": func(kv ...any) map[string]any {
			m := map[string]any{}
			for i := 0; i+1 < len(kv); i += 2 {
				m[fmt.Sprint(kv[i])] = kv[i+1]
			}
			return m
		},
		"get":      func(m map[string]any, k string) any { return m[k] },
		"set":      func(m map[string]any, k string, v any) map[string]any { m[k] = v; return m },
		"append":   func(l []any, v any) []any { return append(append([]any(nil), l...), v) },
		"deepCopy": func(v any) (any, error) { return deepCopy(v) },
		"join":     func(sep string, l []any) string { return joinAny(sep, l) },
		"toYaml": func(v any) (string, error) {
			b, err := yaml.Marshal(v)
			return strings.TrimSuffix(string(b), "\n"), err
		},
	}
}

// toInt is Sprig's int for the numbers values hold: float64 from values.yaml, int64 from --set.
func toInt(v any) (int, error) {
	switch n := v.(type) {
	case float64:
		return int(n), nil
	case int64:
		return int(n), nil
	case int:
		return n, nil
	}
	return 0, fmt.Errorf("int of %T %v", v, v)
}

func indent(n int, s string) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
}

func deepCopy(v any) (any, error) {
	b, err := yaml.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	return out, yaml.Unmarshal(b, &out)
}

func joinAny(sep string, l []any) string {
	s := make([]string, len(l))
	for i, v := range l {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, sep)
}
