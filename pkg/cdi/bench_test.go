package cdi

import (
	"fmt"
	"testing"
)

// The CDI cache with auto-refresh rescans the whole spec directory on every write or removal
// (docs/performance.md). These benchmarks show that a Writer's cost per spec does not
// grow with the number of specs already in the directory: compare existing=0 with existing=1000.
//
//	go test -run '^$' -bench . -benchtime 200x ./pkg/cdi/

// benchUID returns a distinct canonical claim UID for n.
func benchUID(n int) string {
	return fmt.Sprintf("00000000-0000-4000-8000-%012d", n)
}

// prefill writes n specs with UIDs from offset into w's spec dir.
func prefill(b *testing.B, w *Writer, offset, n int) {
	b.Helper()
	c := perClaimClaim(gpu0Result(), gpu3Result())
	for i := range n {
		c.UID = benchUID(offset + i)
		if err := w.Write(c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWrite(b *testing.B) {
	for _, existing := range []int{0, 1000} {
		for _, batch := range []int{1, 100} {
			b.Run(fmt.Sprintf("existing=%d/batch=%d", existing, batch), func(b *testing.B) {
				w := newTestWriter(b, nil)
				prefill(b, w, 1_000_000, existing)
				c := perClaimClaim(gpu0Result(), gpu3Result())
				for n := 0; b.Loop(); n++ {
					// Alternate the limit so that every write changes the bytes (an unchanged
					// claim is skipped) while the directory keeps its size.
					c.Results[0].Cores = int64(1 + n%2)
					for i := range batch {
						c.UID = benchUID(i)
						if err := w.Write(c); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/spec")
			})
		}
	}
}

func BenchmarkRemove(b *testing.B) {
	for _, existing := range []int{0, 1000} {
		b.Run(fmt.Sprintf("existing=%d", existing), func(b *testing.B) {
			w := newTestWriter(b, nil)
			prefill(b, w, 1_000_000, existing)
			c := perClaimClaim(gpu0Result())
			for n := 0; b.Loop(); n++ {
				b.StopTimer()
				c.UID = benchUID(n)
				if err := w.Write(c); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := w.Remove(c.UID); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRewriteUnchanged is the idempotent path (kubelet retries, start-up re-creation):
// the file already holds the bytes, so nothing is written.
func BenchmarkRewriteUnchanged(b *testing.B) {
	w := newTestWriter(b, nil)
	prefill(b, w, 1_000_000, 1000)
	c := perClaimClaim(gpu0Result(), gpu3Result())
	if err := w.Write(c); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := w.Write(c); err != nil {
			b.Fatal(err)
		}
	}
}
