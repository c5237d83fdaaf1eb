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
// pids.config in place (its lock waited for at most LockTimeout) → OK. Each step answers its
// own status; nothing unknown passes.
//
// # Bounds
//
// The accept loop never blocks on a client: every connection gets a goroutine with
// deadlines. That goroutine first identifies the caller by what the kernel says — its
// SO_PEERCRED PID and that PID's cgroup, i.e. its container and its pod — and every bound is
// kept per caller and per pod (loads.go): connections still reading their frame
// (MaxOpenConnsPerCaller, MaxOpenConnsPerPod), whole requests in flight (MaxRequestsPerCaller,
// MaxRequestsPerPod); the node-wide bounds only cap descriptors. Over a bound the answer is
// BUSY with retry_after_ms, except that a request over its caller's or pod's in-flight bound
// first waits for one of their slots (at most MaxOpenConnsPerCaller of a caller's and
// MaxOpenConnsPerPod of a pod's wait, each at most LockTimeout): 64 processes of one container
// registering at once are served in turn instead of most of them being sent away for 20 ms. A
// request waiting for its pids.config no longer counts against MaxRequests, and a newcomer over
// MaxOpenConns takes the place of the newest stalled connection of the pod holding the most
// (shedFor). One container's flood — stalled connections, a pids.config it holds locked,
// requests naming made-up pods — therefore slows only itself and its pod, and many pods' floods
// do not lock another container out.
//
// Concurrent writes of one pids.config are coalesced (coalesce.go): a registration is answered
// by the first write that lists its process or started after it arrived.
//
// The package does not import the NRI plugin or the driver: it owns the small interfaces it
// needs (ContainerResolver, ClaimResolver, ReservationReader) and the process wires adapters
// to them.
package registry
