package deviceplugin

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkPreferred is the preference itself, in memory, on 8 GPUs of 10 shares with every
// other share available, next to the trivial answer (must-include, then the available IDs in
// order) on the same input, timed in turn in the same run (x-trivial = ours / trivial).
func BenchmarkPreferred(b *testing.B) {
	inv := testInventory(b, 8, 10)
	var available []string
	for g := range 8 {
		for s := 0; s < 10; s += 2 {
			available = append(available, id(g, s))
		}
	}
	must := available[7:8]
	for _, policy := range []Policy{PolicyBinpack, PolicySpread} {
		for _, size := range []int{1, 4} {
			b.Run(fmt.Sprintf("policy=%s/size=%d", policy, size), func(b *testing.B) {
				var ours, trivial time.Duration
				b.ReportAllocs()
				for range b.N {
					start := time.Now()
					if got, err := inv.preferredSafe(policy, available, must, size); err != nil || len(got) != size {
						b.Fatalf("preferred = %v, %v", got, err)
					}
					mid := time.Now()
					if got := fallbackPreference(available, must, size); len(got) != size {
						b.Fatalf("trivial = %v", got)
					}
					ours, trivial = ours+mid.Sub(start), trivial+time.Since(mid)
				}
				b.ReportMetric(float64(ours.Nanoseconds())/float64(b.N), "ns/preference")
				b.ReportMetric(float64(trivial.Nanoseconds())/float64(b.N), "trivial-ns")
				b.ReportMetric(float64(ours)/float64(trivial), "x-trivial")
			})
		}
	}
}
