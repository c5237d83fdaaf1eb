package driver

import (
	"maps"
	"sync"
)

// Quarantine holds the prepared claims whose files start-up recovery could not restore, with
// the reason. One such claim must not stop the node: the plugin serves every other claim,
// while the quarantined one's Prepare retries the restoration (and fails with the reason until
// it works) and its containers are failed by the NRI plugin with the reason. It is shared by
// the driver and the NRI side (pkg/plugin builds one for both).
type Quarantine struct {
	mu     sync.Mutex
	claims map[string]error
	// onChange reports the count (the quarantined_claims gauge); may be nil.
	onChange func(n int)
}

// NewQuarantine returns an empty quarantine; onChange (may be nil) is told the count whenever
// it changes.
func NewQuarantine(onChange func(n int)) *Quarantine {
	return &Quarantine{claims: map[string]error{}, onChange: onChange}
}

// Reason returns why the claim is quarantined; nil when it is not.
func (q *Quarantine) Reason(claimUID string) error {
	if q == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.claims[claimUID]
}

// List returns the quarantined claims and their reasons (debug).
func (q *Quarantine) List() map[string]error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return maps.Clone(q.claims)
}

func (q *Quarantine) set(claimUID string, reason error) {
	q.mu.Lock()
	q.claims[claimUID] = reason
	n := len(q.claims)
	q.mu.Unlock()
	if q.onChange != nil {
		q.onChange(n)
	}
}

func (q *Quarantine) clear(claimUID string) {
	q.mu.Lock()
	_, was := q.claims[claimUID]
	delete(q.claims, claimUID)
	n := len(q.claims)
	q.mu.Unlock()
	if was && q.onChange != nil {
		q.onChange(n)
	}
}
