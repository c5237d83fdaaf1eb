package driver

import "sync"

// claimLocks serialises work on one claim while different claims proceed in parallel.
// The kubeletplugin helper's global serialisation is turned off (Serialize(false)): with it, one
// slow claim (an fsync, an API read) holds up every pod on the node, and a burst of 100 claims
// runs one after another. Per-claim locks keep the guarantee that matters — two calls for the
// same claim (a kubelet retry racing the original) never interleave — and the checkpoint's group
// commit turns concurrent claims into few disk writes.
type claimLocks struct {
	mu    sync.Mutex
	locks map[string]*claimLock
}

type claimLock struct {
	sync.Mutex
	users int
}

func newClaimLocks() *claimLocks { return &claimLocks{locks: map[string]*claimLock{}} }

// lock takes the claim's lock and returns its release.
func (c *claimLocks) lock(uid string) func() {
	c.mu.Lock()
	l := c.locks[uid]
	if l == nil {
		l = &claimLock{}
		c.locks[uid] = l
	}
	l.users++
	c.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		c.mu.Lock()
		l.users--
		if l.users == 0 {
			delete(c.locks, uid)
		}
		c.mu.Unlock()
	}
}
