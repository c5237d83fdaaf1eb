// Command benchsummary reads the output of `go test -bench` runs (and of the library's
// start-up bench, which prints its figures as one line in that format) and prints one table of every
// performance target (make bench): the baseline the benchmark measured in the same run, our
// figure, their ratio, the target and PASS or MISS. The targets are listed in one file,
// hack/bench-targets.txt.
//
// Usage: benchsummary -targets hack/bench-targets.txt OUTPUT...
//
// A benchmark that ran several times (-count) is summarised by its median. A target whose
// benchmark did not run in the given outputs is reported as NOT RUN. The exit status is 0 when
// the table could be printed, whatever it says: the benchmarks measure, they do not gate.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// target is one line of the targets file:
//
//	what | benchmark | metric | op limit [unit] [| baseline-metric ours-metric [unit]]
//
// benchmark is a benchmark's full name without the -GOMAXPROCS suffix (sub-benchmarks with
// their slash), metric the unit it reports with b.ReportMetric (or ns/op, allocs/op), op "<="
// or ">=", and unit how the figure is shown (it is not converted). The optional fifth field
// names the metric of the baseline the same run measured and the metric of our figure ("=":
// metric itself), shown beside it with their ratio, ours over the baseline.
type target struct {
	what, benchmark, metric, op string
	limit                       float64
	unit                        string
	baseline, ours, figureUnit  string // the fifth field; empty when absent
}

func parseTargets(r io.Reader) ([]target, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	var out []target
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "|")
		if len(f) != 4 && len(f) != 5 {
			return nil, fmt.Errorf("line %d: want 4 or 5 fields separated by |, got %d", i+1, len(f))
		}
		for j := range f {
			f[j] = strings.TrimSpace(f[j])
		}
		lim := strings.Fields(f[3])
		if len(lim) < 2 || (lim[0] != "<=" && lim[0] != ">=") {
			return nil, fmt.Errorf("line %d: limit %q: want <= or >= and a number", i+1, f[3])
		}
		v, err := strconv.ParseFloat(lim[1], 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("line %d: limit %q: want a positive number", i+1, lim[1])
		}
		t := target{what: f[0], benchmark: f[1], metric: f[2], op: lim[0], limit: v, unit: strings.Join(lim[2:], " ")}
		if len(f) == 5 {
			b := strings.Fields(f[4])
			if len(b) < 2 || len(b) > 3 {
				return nil, fmt.Errorf("line %d: baseline %q: want the baseline's metric, ours (or =) and a unit", i+1, f[4])
			}
			t.baseline, t.ours = b[0], b[1]
			if t.ours == "=" {
				t.ours = t.metric
			}
			if len(b) == 3 {
				t.figureUnit = b[2]
			}
		}
		out = append(out, t)
	}
	return out, nil
}

// results maps "benchmark metric" to every value reported for it.
type results map[string][]float64

// parseBench reads `go test -bench` output, -v or not. A result line is the benchmark's name,
// the iteration count and value-unit pairs; a benchmark's log lines can split the name from
// the rest, so a line that starts with the iteration count belongs to the last name seen.
func parseBench(r io.Reader, into results) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	last := ""
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if strings.HasPrefix(f[0], "Benchmark") {
			last = trimProcs(f[0])
			f = f[1:]
		} else if last == "" || !isCount(f[0]) {
			continue
		}
		if len(f) < 3 || !isCount(f[0]) {
			continue
		}
		for i := 1; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			key := last + " " + f[i+1]
			into[key] = append(into[key], v)
		}
	}
	return nil
}

// trimProcs removes the -GOMAXPROCS suffix go test adds to a benchmark's name.
func trimProcs(name string) string {
	if i := strings.LastIndexByte(name, '-'); i > 0 && isCount(name[i+1:]) {
		return name[:i]
	}
	return name
}

func isCount(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n > 0
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// summarise writes the table and returns how many targets were met and how many were measured.
// With measuredOnly, targets whose benchmark did not run are left out of the table.
func summarise(w io.Writer, targets []target, res results, measuredOnly bool) (met, measured int) {
	const row = "%-62s %12s %12s %8s %12s %14s  %s\n"
	fmt.Fprintf(w, row, "target", "baseline", "ours", "ratio", "measured", "limit", "result")
	for _, t := range targets {
		vals := res[t.benchmark+" "+t.metric]
		limit := t.op + " " + trimFloat(t.limit) + t.unit
		if len(vals) == 0 {
			if measuredOnly {
				continue
			}
			fmt.Fprintf(w, row, t.what, "—", "—", "—", "—", limit, "NOT RUN ("+t.benchmark+" "+t.metric+")")
			continue
		}
		measured++
		v := median(vals)
		pass := v <= t.limit
		if t.op == ">=" {
			pass = v >= t.limit
		}
		result := "MISS"
		if pass {
			result, met = "PASS", met+1
		}
		base, ours, ratio := "—", "—", "—"
		if t.baseline != "" {
			bv, ov := res[t.benchmark+" "+t.baseline], res[t.benchmark+" "+t.ours]
			if len(bv) > 0 {
				base = trimFloat(median(bv)) + t.figureUnit
			}
			if len(ov) > 0 {
				ours = trimFloat(median(ov)) + t.figureUnit
			}
			if len(bv) > 0 && len(ov) > 0 && median(bv) != 0 {
				ratio = strconv.FormatFloat(median(ov)/median(bv), 'f', 2, 64) + "x"
			}
		}
		fmt.Fprintf(w, row, t.what, base, ours, ratio, trimFloat(v)+t.unit, limit, result)
	}
	fmt.Fprintf(w, "%d of %d targets met (%d measured); ratio = ours / the baseline measured in the same run; measured is the figure the limit applies to\n", met, len(targets), measured)
	return met, measured
}

// trimFloat prints v with at most 3 decimals and no trailing zeros.
func trimFloat(v float64) string {
	return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64)
}

func run(args []string, stdout io.Writer) error {
	flags := flag.NewFlagSet("benchsummary", flag.ContinueOnError)
	targetsFile := flags.String("targets", "", "the targets file (hack/bench-targets.txt)")
	measuredOnly := flags.Bool("measured-only", false, "leave out the targets whose benchmark did not run")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *targetsFile == "" || flags.NArg() == 0 {
		return errors.New("usage: benchsummary -targets FILE OUTPUT...")
	}
	f, err := os.Open(*targetsFile)
	if err != nil {
		return err
	}
	defer f.Close()
	targets, err := parseTargets(f)
	if err != nil {
		return fmt.Errorf("%s: %w", *targetsFile, err)
	}
	res := results{}
	for _, name := range flags.Args() {
		out, err := os.Open(name)
		if errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(stdout, "(no %s: its benchmarks did not run)\n", name)
			continue
		}
		if err != nil {
			return err
		}
		err = parseBench(out, res)
		out.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	summarise(stdout, targets, res, *measuredOnly)
	return nil
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchsummary:", err)
		os.Exit(2)
	}
}
