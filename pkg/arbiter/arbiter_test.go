package arbiter

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

func TestDivide(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shares []Share
		want   []float64
	}{
		{"alone at its allowance bursts to its ceiling",
			[]Share{{Request: 30, Ceiling: 100, Util: 30}}, []float64{100}},
		{"no ceiling: its request",
			[]Share{{Request: 30, Util: 30}}, []float64{30}},
		{"idle keeps its request as a floor",
			[]Share{{Request: 30, Ceiling: 100, Util: 0}}, []float64{30}},
		{"under its allowance: what it used plus headroom",
			[]Share{{Request: 30, Ceiling: 100, Util: 50, Prev: 100}}, []float64{55}},
		{"saturated GPU: contended shares get their requests back",
			[]Share{{Request: 30, Ceiling: 100, Util: 50, Prev: 100}, {Request: 70, Util: 50}}, []float64{30, 70}},
		{"guaranteed bursts first, best-effort takes the rest",
			[]Share{{Request: 20, Ceiling: 100, Util: 20}, {Class: BestEffort, Request: 20, Ceiling: 100, Util: 20}, {Request: 40, Util: 0}},
			[]float64{80, 20, 40}},
		{"two bursters of a class share in proportion to requests",
			[]Share{{Request: 10, Ceiling: 100, Util: 10}, {Request: 30, Ceiling: 100, Util: 30}}, []float64{25, 75}},
		{"request bounded to 1-100, ceiling at least the request",
			[]Share{{Request: 0, Ceiling: 0, Util: 0}, {Request: 500, Ceiling: 50, Util: 0}}, []float64{1, 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Divide(tc.shares)
			for i, w := range tc.want {
				if got[i] != w {
					t.Errorf("share %d: allowance %v, want %v (all: %v)", i, got[i], w, got)
				}
			}
		})
	}
}

func TestEndPassPublishesChangesOnly(t *testing.T) {
	dir := t.TempDir()
	a := New(nil)
	writes := 0
	write := a.write
	a.write = func(p string, d []byte) error { writes++; return write(p, d) }
	pass := func(util float64) {
		a.Divide("GPU-b", []Input{{Share: Share{Key: "c1", Request: 30, Ceiling: 100, Util: util}, ConfigDirs: []string{dir}}})
		a.Divide("GPU-a", []Input{{Share: Share{Key: "c1", Request: 20, Util: 0}, ConfigDirs: []string{dir}}})
		a.EndPass()
	}
	pass(30)
	data, err := os.ReadFile(filepath.Join(dir, contract.CoreAllowanceName))
	if err != nil {
		t.Fatal(err)
	}
	if want := "version 1\ngpu GPU-a 20\ngpu GPU-b 100\n"; string(data) != want {
		t.Fatalf("file:\n%s\nwant:\n%s", data, want)
	}
	got, err := contract.ParseCoreAllowances(data)
	if err != nil || got["GPU-b"] != 100 || got["GPU-a"] != 20 {
		t.Fatalf("parsed %v, %v", got, err)
	}
	pass(100)
	if writes != 1 {
		t.Errorf("%d writes for an unchanged division, want 1", writes)
	}
	if al, ok := a.Allowance("c1", "GPU-b"); !ok || al != 100 {
		t.Errorf("Allowance = %v, %v", al, ok)
	}
	s := a.Snapshot()["c1"]["GPU-b"]
	if s.Request != 30 || s.Ceiling != 100 || s.Class != Guaranteed || s.Util != 100 {
		t.Errorf("snapshot %+v", s)
	}
	a.EndPass() // a pass without the target forgets it
	if _, ok := a.Allowance("c1", "GPU-b"); ok {
		t.Error("a target no pass divided for is still remembered")
	}
}

func TestEndPassRetriesAFailedWrite(t *testing.T) {
	a := New(nil)
	var failed []string
	a.onError = func(target, path string, err error) { failed = append(failed, target) }
	fail := true
	dir := t.TempDir()
	write := a.write
	a.write = func(p string, d []byte) error {
		if fail {
			return errors.New("disk full")
		}
		return write(p, d)
	}
	for range 2 {
		a.Divide("GPU-a", []Input{{Share: Share{Key: "c1", Request: 30, Util: 30}, ConfigDirs: []string{dir}}})
		a.EndPass()
		fail = false
	}
	if len(failed) != 1 {
		t.Errorf("errors reported for %v, want one", failed)
	}
	if _, err := os.Stat(filepath.Join(dir, contract.CoreAllowanceName)); err != nil {
		t.Errorf("the write was not retried: %v", err)
	}
}
