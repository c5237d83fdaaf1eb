package main

import (
	"strings"
	"testing"
)

// A -v run: log lines split a name from its figures, a sub-benchmark repeats (-count), the
// GOMAXPROCS suffix is on every name.
const benchOutput = `goos: linux
BenchmarkCompare
    compare_test.go:80: round 1, vgpu-dra: done
BenchmarkCompare-2   	       1	9123 ns/op	         0.9000 prepare-p50-x	4.5 prepare-p50-ours	5.0 prepare-p50-test	        21.00 threads-ours
BenchmarkNRICreateContainer-2   	time="2026-12-01T15:23:06Z" level=info msg="plugin connected"
     1	6818197604 ns/op	        85.00 added-p50-µs-claim-tmpfs	       591.0 added-p50-µs-disk
BenchmarkRegistration/clients=8-2         	       1	  11423244 ns/op	       426.0 p50-µs	2500 p99-µs
BenchmarkRegistration/clients=8-2         	       1	  11423244 ns/op	       426.0 p50-µs	1500 p99-µs
BenchmarkRegistration/clients=8-2         	       1	  11423244 ns/op	       426.0 p50-µs	1900 p99-µs
PASS
ok  	github.com/vgpu-dra/vgpu-dra/test/integration	16.638s
`

func TestParseBench(t *testing.T) {
	res := results{}
	if err := parseBench(strings.NewReader(benchOutput), res); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]float64{
		"BenchmarkCompare prepare-p50-x":                0.9,
		"BenchmarkCompare threads-ours":                 21,
		"BenchmarkNRICreateContainer added-p50-µs-disk": 591,
		"BenchmarkRegistration/clients=8 p99-µs":        1900, // the median of three
	} {
		if got := res[key]; len(got) == 0 || median(got) != want {
			t.Errorf("%s = %v, want median %v", key, got, want)
		}
	}
	if _, ok := res["BenchmarkCompare round"]; ok {
		t.Error("a log line was read as a result")
	}
}

// The library's start-up bench (library/test/bench_startup.c): its own table, whose rows start
// with a round number, then one line in the format of go test -bench.
const libraryOutput = `round                    wall s  cuInit p50 ms  cuInit max ms     ctx p50 ms   attempts       not OK no connect
1     driver alone        0.381           2.61         238.44           0.08
1     library             0.508          78.34         202.28           0.04        300            0          0
300 processes at once, first fork to last exit (median): driver alone 0.173 s, library 0.508 s (2.93x); target <= 5 s: PASS
BenchmarkLibraryStartup300 1 0.508 wall-s 0.173 driver-wall-s 126.00 retries/round
`

func TestParseBenchReadsTheLibraryLine(t *testing.T) {
	res := results{}
	if err := parseBench(strings.NewReader(libraryOutput), res); err != nil {
		t.Fatal(err)
	}
	want := results{
		"BenchmarkLibraryStartup300 wall-s":        {0.508},
		"BenchmarkLibraryStartup300 driver-wall-s": {0.173},
		"BenchmarkLibraryStartup300 retries/round": {126},
	}
	if len(res) != len(want) {
		t.Errorf("read %v, want only %v", res, want)
	}
	for key, v := range want {
		if got := res[key]; len(got) != 1 || got[0] != v[0] {
			t.Errorf("%s = %v, want %v", key, got, v)
		}
	}
}

func TestSummarise(t *testing.T) {
	targets, err := parseTargets(strings.NewReader(`# comment
Prepare p50 | BenchmarkCompare | prepare-p50-x | <= 1.0 x | prepare-p50-test prepare-p50-ours ms
Threads | BenchmarkCompare | threads-ours | <= 20
NRI p50 | BenchmarkNRICreateContainer | added-p50-µs-disk | <= 150 µs
Registry p99, 8 | BenchmarkRegistration/clients=8 | p99-µs | <= 2000 µs
Sync | BenchmarkSynchronize10k | sync-cold-ms | <= 50 ms
`))
	if err != nil {
		t.Fatal(err)
	}
	res := results{}
	if err := parseBench(strings.NewReader(benchOutput), res); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	met, measured := summarise(&out, targets, res, false)
	if met != 2 || measured != 4 {
		t.Errorf("met %d of %d measured, want 2 of 4:\n%s", met, measured, out.String())
	}
	for _, want := range []string{
		"Prepare p50", "5ms", "4.5ms", "0.90x", "0.9x", "PASS",
		"Threads", "MISS",
		"NRI p50", "591µs",
		"Sync", "NOT RUN",
		"2 of 5 targets met (4 measured)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestParseTargetsRefusesBadLines(t *testing.T) {
	for _, line := range []string{
		"a | b | c",
		"a | b | c | < 1",
		"a | b | c | <= x",
		"a | b | c | <= -1",
		"a | b | c | <= 1 | base",
		"a | b | c | <= 1 | base ours unit extra",
	} {
		if _, err := parseTargets(strings.NewReader(line)); err == nil {
			t.Errorf("%q accepted", line)
		}
	}
}
