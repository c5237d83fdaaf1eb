package checkpoint

import "maps"

// batchState is the state a batch builds on the durable one, copy-on-write: the durable claims
// are shared with every reader and never modified; the batch keeps only what it changes — the
// claims it puts, each a record of its own that nothing outside the store holds, and the claims
// it deletes. Copying the state is then a shallow copy of the claims map (data), and only the
// claims a mutation replaces are copied in depth.
type batchState struct {
	base   *Data
	bootID string
	// changed are the claims the batch put (their records) or deleted (nil), by UID.
	changed map[string]*Claim
}

func newBatchState(base *Data) *batchState {
	return &batchState{base: base, bootID: base.BootID}
}

// get returns the claim as the batch has it so far, without copying.
func (b *batchState) get(uid string) (Claim, bool) {
	if c, ok := b.changed[uid]; ok {
		if c == nil {
			return Claim{}, false
		}
		return *c, true
	}
	c, ok := b.base.Claims[uid]
	return c, ok
}

// put records c under uid. c must share no memory that anything outside the store may change:
// a deep copy, or a record whose slices are the store's own (immutable) ones.
func (b *batchState) put(uid string, c Claim) {
	if b.changed == nil {
		b.changed = map[string]*Claim{}
	}
	b.changed[uid] = &c
}

func (b *batchState) delete(uid string) {
	if _, ok := b.get(uid); !ok {
		return
	}
	if b.changed == nil {
		b.changed = map[string]*Claim{}
	}
	b.changed[uid] = nil
}

// data returns the state as the batch has it so far: a new claims map that shares its records
// with the durable state and the batch.
func (b *batchState) data() Data {
	claims := maps.Clone(b.base.Claims)
	if claims == nil {
		claims = make(map[string]Claim, len(b.changed))
	}
	for uid, c := range b.changed {
		if c == nil {
			delete(claims, uid)
		} else {
			claims[uid] = *c
		}
	}
	return Data{BootID: b.bootID, Claims: claims}
}

// absorb takes what a mutation made of data() into the batch: every claim it added or
// replaced (a deep copy: the mutation's caller may hold the slices it stored), every claim it
// deleted, the boot ID. A claim the mutation left as it was costs a comparison only.
func (b *batchState) absorb(trial Data) {
	for uid, c := range trial.Claims {
		if old, ok := b.get(uid); ok && c.equal(old) {
			continue
		}
		b.put(uid, c.DeepCopy())
	}
	for uid := range b.base.Claims {
		if _, ok := trial.Claims[uid]; !ok {
			b.delete(uid)
		}
	}
	for uid, c := range b.changed {
		if _, ok := trial.Claims[uid]; c != nil && !ok {
			b.changed[uid] = nil
		}
	}
	b.bootID = trial.BootID
}
