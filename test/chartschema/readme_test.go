package chartschema

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEListsEveryValue: the chart README's values table names every value of values.yaml
// (a free-form object such as resources as one value), so that a value added to the chart is
// documented where users look for it.
func TestREADMEListsEveryValue(t *testing.T) {
	c := loadChart(t)
	raw, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed, err := valuesTable(string(raw))
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	for _, path := range c.leaves() {
		if !listed[path] {
			t.Errorf("README.md's values table does not list %s", path)
		}
	}
	for path := range listed {
		if c.node(path) == nil {
			t.Errorf("README.md's values table lists %s, which the chart does not have", path)
		}
	}
}

var (
	valuesHeading = regexp.MustCompile(`(?m)^## Values\n`)
	backticked    = regexp.MustCompile("`([^`]+)`")
)

// valuesTable returns the values named in the first column of the table under "## Values". A
// row names its values in backticks, separated by commas; a name that starts with "." is
// relative to the parent of the row's first name ("`webhook.resources`, `.nodeSelector`").
func valuesTable(readme string) (map[string]bool, error) {
	loc := valuesHeading.FindStringIndex(readme)
	if loc == nil {
		return nil, errors.New(`no "## Values" section`)
	}
	section := readme[loc[1]:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.SplitN(line[1:], "|", 2)[0]
		parent := ""
		for i, m := range backticked.FindAllStringSubmatch(first, -1) {
			name := m[1]
			if i == 0 {
				if dot := strings.LastIndex(name, "."); dot >= 0 {
					parent = name[:dot]
				}
			}
			if strings.HasPrefix(name, ".") {
				name = parent + name
			}
			listed[name] = true
		}
	}
	return listed, nil
}
