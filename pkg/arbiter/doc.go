// Package arbiter divides each shared GPU's cores between the containers on it (contract §16):
// guaranteed and best-effort classes, and bursts above a share's request up to its ceiling into
// time the others leave idle. It runs inside the node enforcer's compute pass, from the
// utilisation NVML reports and the terms the checkpoint records — never from anything a
// container can write — and publishes each container's allowance in a file of its read-only
// config directory, which libvgpu.so's core limiter follows; the enforcer holds a container
// that ignores it to the same allowance.
package arbiter
