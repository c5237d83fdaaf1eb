// Package enforce is the node-side wall of vgpu-dra (docs/design/threat-model.md, contract
// §15): it holds a container to its claim's memory on each GPU from outside the container, where
// no tenant can reach it. libvgpu.so, inside the container, is the fast and cooperative layer
// that makes every ordinary program fail an allocation cleanly at its limit; a tenant who gets
// around it (unloads it, forges its configuration, calls the driver through libc's own dlsym)
// still meets this package.
//
// On a period of its own, off every request path, an Enforcer asks the driver (NVML) which
// processes hold memory on every GPU it serves, maps each process to its container by its
// cgroup (never by a file the container can write), sums a container's processes per GPU and
// compares the sum with the container's limit there, plus a slack per process for the context
// memory the driver charges. A container over its limit for longer than a grace, or a process
// in a vGPU container that holds GPU memory but never registered with the node's registry, has
// its processes on that GPU killed (pidfd plus a cgroup check, as the NRI plugin's stray guard
// does); a process on a served GPU that belongs to no vGPU container is reported, or killed when
// the operator says so. Every action is counted, logged once and raised as an event on the pod.
//
// The Enforcer acts only while its process owns the node (the handover's owner instance): the
// kubelet plugin runs it with the owner's term, the device plugin (which holds the instance lock
// for its life and never hands over) from its start to its stop. Its decisions are idempotent: a pass that finds the same
// processes over the limit again kills the survivors again, and a restarted plugin starts with
// no memory of earlier passes, so a container is only ever killed after a full grace observed
// by the instance that kills it.
package enforce
