package checkpoint

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkUpdate measures one durable Update: a single caller in a loop (each call pays a
// whole fsync'd write), and 100 concurrent callers (who share writes by group commit). Each
// call changes the data so that no write is skipped. writes/op shows the coalescing.
func BenchmarkUpdate(b *testing.B) {
	b.Run("sequential-1-claim", func(b *testing.B) {
		s := openStore(b, checkpointPath(b))
		var wc writeCounter
		wc.install(s)
		c := fullClaim()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			c.Devices[0].Cores = int64(i)
			if err := s.Update(putClaim(uidA, c.DeepCopy())); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(wc.count())/float64(b.N), "writes/op")
	})
	b.Run("concurrent-100", func(b *testing.B) {
		const updaters = 100
		s := openStore(b, checkpointPath(b))
		var wc writeCounter
		wc.install(s)
		uids := make([]string, updaters)
		for g := range uids {
			uids[g] = fmt.Sprintf("00000000-0000-4000-8000-%012d", g)
		}
		var next atomic.Int64
		b.ResetTimer()
		var wg sync.WaitGroup
		for g := range updaters {
			wg.Go(func() {
				c := fullClaim()
				for {
					i := next.Add(1)
					if i > int64(b.N) {
						return
					}
					c.Devices[0].Cores = i
					if err := s.Update(putClaim(uids[g], c.DeepCopy())); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		b.ReportMetric(float64(wc.count())/float64(b.N), "writes/op")
	})
}
