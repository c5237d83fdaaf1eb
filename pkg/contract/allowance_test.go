package contract

import (
	"strings"
	"testing"
)

func TestCoreAllowancesRoundTrip(t *testing.T) {
	data := EncodeCoreAllowances(map[string]float64{"GPU-b": 99.6, "GPU-a": 0, "GPU-c": 300})
	if want := "version 1\ngpu GPU-a 1\ngpu GPU-b 100\ngpu GPU-c 100\n"; string(data) != want {
		t.Fatalf("encoded %q, want %q", data, want)
	}
	got, err := ParseCoreAllowances(data)
	if err != nil || len(got) != 3 || got["GPU-a"] != 1 {
		t.Fatalf("parsed %v, %v", got, err)
	}
}

func TestParseCoreAllowancesRefusesForgeries(t *testing.T) {
	for name, in := range map[string]string{
		"no version":     "gpu GPU-a 50\n",
		"other version":  "version 2\ngpu GPU-a 50\n",
		"percent over":   "version 1\ngpu GPU-a 101\n",
		"percent zero":   "version 1\ngpu GPU-a 0\n",
		"not a number":   "version 1\ngpu GPU-a lots\n",
		"twice":          "version 1\ngpu GPU-a 5\ngpu GPU-a 50\n",
		"fields missing": "version 1\ngpu GPU-a\n",
		"too large":      "version 1\n" + strings.Repeat("# padding\n", 500),
	} {
		if _, err := ParseCoreAllowances([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	got, err := ParseCoreAllowances([]byte("# c\nversion 1\nfuture key\ngpu GPU-a 7\n"))
	if err != nil || got["GPU-a"] != 7 {
		t.Errorf("unknown keys not skipped: %v, %v", got, err)
	}
}
