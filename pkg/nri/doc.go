// Package nri is the NRI plugin embedded in the kubelet plugin (architecture.md, contract §4):
// it gives every container of a vGPU claim prepared on the NRI path its own directory (three
// bind mounts) and identity (VGPU_POD_UID, VGPU_CONTAINER_NAME) when the runtime creates it,
// and keeps a cache of those containers — with their init PID and cgroup — that the registry
// server reads.
//
// # Parts
//
//   - Plugin: the hooks. CreateContainer validates and injects; StartContainer records PID and
//     cgroup; StopContainer marks an instance stopped; RemoveContainer (also the runtime's undo
//     of a failed creation) and StopPodSandbox clean up by container ID; Synchronize rebuilds
//     the cache from the replayed containers with no API reads.
//   - Cache: instances keyed by container ID, indexed by (pod UID, container name) → newest.
//   - Supervisor: the connection's life (fresh stub per attempt, watchdog, capped backoff),
//     liveness (Check) and the path of newly prepared claims (ClaimPath).
//   - ServeDebug: JSON state on a local unix socket.
//   - Ownership and Decisions (contract §14): while a new instance takes the node over, two
//     plugins of one name are registered; only the owner decides a CreateContainer and touches
//     directories, an observer answers without an adjustment and keeps the runtime's view
//     (Synchronize, PostCreateContainer, Start, Stop, Remove). Own rebuilds the cache from that
//     view when the instance becomes the owner. A per-container mark tells the instance that
//     the runtime calls second that the first already decided, so a container gets its mounts
//     exactly once. Without SetOwnership the plugin always owns.
//
// The package knows prepared claims only through the Claims interface, which pkg/plugin
// satisfies from the checkpoint and the API server; it builds host paths only through
// pkg/claimdir.
//
// # Path of a new claim
//
// NRI when the plugin is connected or this process has had a good session; per-claim when NRI
// has never been reachable. The first Prepare after start-up waits (at most
// SupervisorConfig.FirstAttemptWait, default 2 s) for the outcome of the first connection
// attempt. The choice is recorded in the checkpoint and never changes for that claim.
//
// # Failure policy
//
// A vGPU container must not be created without our adjustment. Two mechanisms, from the most
// to the least widely supported:
//
//   - The webhook annotates each vGPU container with
//     required-plugins.noderesource.dev/container.<name>: '["<driver>"]'. containerd's default
//     NRI validator (enabled in its NRI configuration) then refuses to create the container
//     while no plugin of that name is registered — the main guard, and the only one that
//     covers a plugin that is not connected at all.
//   - The plugin declares the failure policy FailRequest (NRI ≥ 0.12.4): a request it fails to
//     answer (timeout, lost connection) fails instead of proceeding without it. Runtimes with an
//     older NRI (containerd 2.4.2 ships 0.12.3) ignore the field and proceed: there, a plugin
//     that times out is dropped and the container is created without the directory. The
//     library then refuses to run unlimited, and CreateContainer undoes any directory it made
//     after its deadline.
//
// A container created without the adjustment all the same (the plugin died or timed out under
// its CreateContainer) is stopped at the next Synchronize when the plugin would have adjusted
// it (stray.go); the kubelet creates it again.
//
// Cleanup hooks never return errors, so they fail a CRI call only if they time out under
// FailRequest; the kubelet retries those calls.
package nri
