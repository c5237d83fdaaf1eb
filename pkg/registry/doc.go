// Package registry is the node's registration service for libvgpu.so (contract §5, §6): the
// wire protocol codec, the server on <state>/registry/registry.sock, the peer check, the
// pids.config writer, and a Go client.
//
// # Flow of one registration
//
// accept → read one frame (header within 2 s, body within 2 s after) → resolve the target
// (NRI path: the container cache, behind its Synchronize readiness gate; per-claim path: the
// claim of the register UUID) → check the caller (SO_PEERCRED PID → its cgroup must be the
// target's or below; per-claim: its pod must be in the claim's reservedFor) → write
// pids.config in place → OK. Each step answers its own status; nothing unknown passes.
//
// # Bounds
//
// The accept loop never blocks on a client: every connection gets a goroutine with
// deadlines. Connections still reading their frame count against MaxOpenConns; whole frames
// count against MaxRequests and MaxRequestsPerPod. Over a bound the answer is BUSY with
// retry_after_ms. A flood of stalled connections therefore costs one parked goroutine each
// and never delays a well-formed registration.
//
// The package does not import the NRI plugin or the driver: it owns the small interfaces it
// needs (ContainerResolver, ClaimResolver) and the process wires adapters to them.
package registry
