package driver

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// perClaim runs one function per claim concurrently and collects their results by claim UID.
// Claims of one kubelet call are independent (each takes its own claim lock); running them in
// parallel lets the checkpoint's group commit turn a burst into few disk writes.
func perClaim[C any, R any](claims []C, uid func(C) types.UID, fn func(C) R) map[types.UID]R {
	results := make(map[types.UID]R, len(claims))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range claims {
		wg.Go(func() {
			r := fn(c)
			mu.Lock()
			results[uid(c)] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	return results
}
