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
// behind an atomic pointer. Get and Snapshot deep-copy from it without I/O or locks.
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
//     and applies the mutations in arrival order, each to its own deep copy of the state so
//     far, starting from the durable state. A mutation that returns an error (or panics) is
//     discarded with its copy: it leaves nothing behind and only its caller sees the error
//     (a panic is re-raised in the caller's goroutine).
//   - If at least one mutation succeeded and the encoded data differs from what is on disk,
//     the leader writes the file once. On success it publishes a fresh copy of the new state
//     (nothing a mutation kept a reference to can reach the durable state); on
//     failure the durable state and the file stay as they were, the temporary file is
//     removed, and every caller whose mutation succeeded gets the wrapped write error.
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
// Cost: a batch of b mutations over n claims copies the state b+1 times in memory (each copy
// allocates a handful of arrays, not a few per claim) and encodes and writes it once.
//
// Mutations run on the leader's goroutine while others wait: they must be quick, do no I/O
// and must not call the Store.
package checkpoint
