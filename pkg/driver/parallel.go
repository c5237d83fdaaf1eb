package driver

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// fileParallelism bounds the claims whose files are made or removed at once. Those are system
// calls that block their OS thread (mkdir, mount, umount, writes; ext4 may wait on its
// journal), and Go gives the other goroutines a new thread while one blocks: a burst of 100
// claims ran 100 threads, which stay for the life of the process. Four keep two cores busy
// while one waits; the checkpoint's group commit still batches every claim of a burst, since
// waiting for the write holds no thread.
const fileParallelism = 4

// withFiles runs fn, which makes or removes a claim's files, in one of fileParallelism slots.
func (d *Driver) withFiles(fn func() error) error {
	d.fileSlots <- struct{}{}
	defer func() { <-d.fileSlots }()
	return fn()
}

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
