package checkpoint

import (
	"fmt"
	"os"
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

// BenchmarkUpdateHeld measures what one update costs the store in memory with n claims already
// recorded — copying the state, comparing and encoding — with the file write left out (a write
// that keeps nothing), so that the cost that grows with the node's claims shows; the fsync'd
// write is BenchmarkUpdate's. Each update replaces one claim's record: through Update (a
// mutation of the claims map, what Prepare used before Put), Put (what Prepare uses) and
// SetReservedFor (a repeated Prepare for another pod, the NRI plugin).
func BenchmarkUpdateHeld(b *testing.B) {
	for _, n := range []int{100, 800} {
		s := openStore(b, checkpointPath(b))
		s.write = func(string, []byte, os.FileMode) error { return nil }
		for i := range n {
			if err := s.Update(putClaim(fmt.Sprintf("00000000-0000-4000-8000-%012d", i), fullClaim())); err != nil {
				b.Fatal(err)
			}
		}
		c := fullClaim()
		b.Run(fmt.Sprintf("claims=%d/update", n), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				c.Devices[0].Cores = int64(i % 100)
				if err := s.Update(putClaim(uidA, c)); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("claims=%d/put", n), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				c.Devices[0].Cores = int64(i % 100)
				if err := s.Put(uidA, c); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("claims=%d/set-reserved-for", n), func(b *testing.B) {
			pods := [][]string{{podX}, {podY}}
			for i := 0; b.Loop(); i++ {
				if err := s.SetReservedFor(uidA, pods[i%2]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
