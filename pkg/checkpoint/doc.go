// Package checkpoint is the kubelet plugin's crash-safe record of prepared claims
// (contract §7): which claims are prepared on this node, how far Prepare got, which path
// (NRI or per-claim) each took, the pods they are reserved for and their devices.
//
// # File
//
// One JSON file, {"version":"v1","writer":"...","checksum":N,"data":{...}}, where N is the
// CRC-32 (IEEE) of the exact bytes of the data value. It is replaced as a whole by
// fsutil.WriteFileAtomic (temporary file in the same directory, fsync, rename, directory
// fsync), mode 0600. A file that does not parse, fails its checksum or has an unknown version
// is reported as a *CorruptError naming the file; one of a newer version than this package
// reads as a *VersionError naming the version and the writer. It is never reset silently. A
// missing file is an empty checkpoint.
//
// # Versions
//
// v1 is the first format; v2 adds a device's adminAccess. Every version ever written is read
// (testdata holds a file of each). A file is written in the oldest version that can hold its
// data, so that a plugin rolled back to one that reads only v1 keeps its claims until an
// admin-access claim is prepared — and then refuses the file, naming v2, rather than count an
// admin-access device against the GPU's capacity.
//
// # Reads
//
// The store keeps the durable state, what the file on disk holds, as an immutable value
// behind an atomic pointer, together with the claims removed by RemoveDeferred that no write
// has carried yet and the per-GPU totals of what the claims take (GPUTotals). Get, Snapshot,
// Find, Range and Totals read the durable state less those claims, without I/O or locks (Get
// and Snapshot deep-copy; Prepare's capacity check reads Totals instead of walking every claim).
//
// # Writes: group commit
//
// Update is called concurrently by many Prepare and Unprepare goroutines, and every write
// costs an fsync (about a millisecond) plus the encoding of every claim. Writing once per
// caller would make N concurrent callers cost O(N) fsyncs and O(N²) encoding, so callers
// coalesce:
//
//   - Update appends its mutation to a queue. If no leader is active, the caller becomes the
//     leader; otherwise it waits for its result, or for leadership to be handed to it.
//   - The leader takes the whole queue as one batch (later arrivals wait for the next batch)
//     and applies the mutations in arrival order to one copy-on-write state (cow.go) that
//     starts from the durable state. A mutation that returns an error (or panics) is discarded:
//     it leaves nothing behind and only its caller sees the error (a panic is re-raised in the
//     caller's goroutine).
//   - If at least one mutation succeeded and the encoded data differs from what is on disk,
//     the leader writes the file once. On success it publishes the new state, which shares
//     every record that did not change with the old one; the records the batch put are the
//     store's own deep copies, so nothing a caller kept a reference to can reach the durable
//     state. On failure the durable state and the file stay as they were, the temporary file
//     is removed, and every caller whose mutation succeeded gets the wrapped write error.
//   - The leader then hands leadership to the oldest waiting caller, if any, and wakes the
//     callers of its batch. A leader therefore commits exactly one batch, the one holding its
//     own mutation: no caller's latency grows with the arrival rate of others (no batching
//     starvation), and it is bounded by the batch in flight plus its own.
//
// Batches run one at a time, each starting from the durable state the previous one
// published. Within a batch a mutation sees the effects of the earlier successful mutations
// of that batch, which are not yet on disk; they commit or fail together with its own, so a
// decision it takes on them can never outlive them. No mutation sees a failed batch's state.
//
// # Copy-on-write
//
// Records (a Claim and its slices) are shared between the states the store publishes and
// never modified once recorded: a change replaces a record with a new one. Put and
// SetReservedFor build the new record themselves; an Update mutation gets a claims map of its
// own over the shared records, and the store keeps a deep copy of each record it added or
// replaced, found by comparing with the record before (Claim.equal). So no mutation may modify
// a recorded claim's slices in place (TestCopyOnWriteLeavesHeldRecordsAlone here, and the
// driver's test of every path that changes the checkpoint, hold the code to it).
//
// Cost: a batch of b Put or SetReservedFor calls over n claims copies the b records it replaces,
// one claims map (shallow, no record copied) for the state it publishes, and the per-GPU totals
// (one entry per GPU); an Update mutation adds one shallow map copy and a comparison per claim.
// The batch is encoded (only the claims that changed, encoder.go) and written once.
//
// Mutations run on the leader's goroutine while others wait: they must be quick, do no I/O
// and must not call the Store.
//
// # Deferred removals
//
// Unprepare need not wait for the disk: once the kubelet is told a claim is unprepared it
// never asks about it again, and a claim that a crash leaves in the file is harmless (start-up
// recovery restores its files, the reconciliation with the API server unprepares it). So
// RemoveDeferred takes a claim out of what readers see at once, under mu, and returns. The
// next batch applies every removal made before it was taken, ahead of its mutations, and
// writes them with its own (a Prepare's write carries an Unprepare's for free); a removal made
// while a batch is being written stays pending for the next. When no Update comes, a flush —
// an empty Update — runs at most the flush delay (DefaultFlushDelay) after the first pending
// removal, and again after each failed write. Close flushes and schedules no more.
package checkpoint
