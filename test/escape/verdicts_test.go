//go:build escape

package escape

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	threatModel = "../../docs/design/threat-model.md"
	tableBegin  = "<!-- escape-verdicts:begin (make escape checks this table; ESCAPE_UPDATE=1 make escape rewrites it) -->"
	tableEnd    = "<!-- escape-verdicts:end -->"
)

// table renders the verdicts as the threat model's table: one row per technique, in the
// suite's order. Figures that vary from run to run stay out of it (they are in the report).
func table(rs []result) string {
	var b strings.Builder
	b.WriteString("| # | Technique (test/escape, `make escape`) | Verdict |\n|---|---|---|\n")
	for i, r := range rs {
		fmt.Fprintf(&b, "| %d | `%s`: %s | %s |\n", i+1, r.id, r.what, r.verdict)
	}
	return b.String()
}

// checkVerdictTable compares the threat model's table with what the suite saw, writes the
// run's report with its figures, and (ESCAPE_UPDATE=1) rewrites the table.
func checkVerdictTable(t *testing.T) {
	rs := sortedResults()
	if len(rs) != len(techniques) {
		t.Fatalf("%d of %d techniques ran: the table is checked after a full run only", len(rs), len(techniques))
	}
	got := table(rs)
	writeReport(t, rs)
	doc, err := os.ReadFile(threatModel)
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	i, j := strings.Index(text, tableBegin), strings.Index(text, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the markers %q … %q", threatModel, tableBegin, tableEnd)
	}
	current := strings.TrimPrefix(text[i+len(tableBegin):j], "\n")
	if current == got {
		return
	}
	if os.Getenv("ESCAPE_UPDATE") == "1" {
		text = text[:i+len(tableBegin)] + "\n" + got + text[j:]
		if err := os.WriteFile(threatModel, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the table of %s", threatModel)
		return
	}
	t.Errorf("the threat model's table of verdicts is not what the suite saw; ESCAPE_UPDATE=1 make escape rewrites it.\nwant:\n%s\nthe page has:\n%s", got, current)
}

// writeReport writes the run's figures to $ESCAPE_REPORT (default _output/escape/report.md).
func writeReport(t *testing.T, rs []result) {
	path := os.Getenv("ESCAPE_REPORT")
	if path == "" {
		path = "../../_output/escape/report.md"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# make escape, %s\n\n| Technique | Verdict | Peak MiB (claim %d) | Over the bound for | Enforcer reactions |\n|---|---|---|---|---|\n",
		time.Now().UTC().Format(time.RFC3339), limitMiB)
	var all []time.Duration
	for _, r := range rs {
		over := "-"
		if r.overFor > 0 {
			over = r.overFor.Round(time.Millisecond).String()
		}
		var rx []string
		for _, d := range r.reactions {
			rx = append(rx, d.Round(time.Millisecond).String())
		}
		all = append(all, r.reactions...)
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s |\n", r.id, r.verdict, r.peakMiB, over, strings.Join(rx, " "))
	}
	if len(all) > 0 {
		slices.Sort(all)
		p := func(q float64) time.Duration { return all[min(len(all)-1, int(q*float64(len(all))))] }
		fmt.Fprintf(&b, "\nEnforcer reaction (first over-limit sample to the kill), %d kills: p50 %v, p99 %v, max %v\n",
			len(all), p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond), all[len(all)-1].Round(time.Millisecond))
	}
	t.Log("\n" + b.String())
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
		_ = os.WriteFile(path, []byte(b.String()), 0o644)
	}
}
