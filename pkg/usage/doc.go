// Package usage measures what each vGPU container uses of its GPUs, for the plugin's
// per-container metrics (contract §8): memory from the container's libvgpu.so ledger (read
// without locks, never blocking), limits from its vgpu.config, and SM utilisation from NVML's
// per-process samples of the PIDs in its pids.config. A background Sampler gathers it all into
// an immutable Snapshot that /metrics only copies out, so neither a scrape nor a slow read
// touches a registration or an NRI hook.
package usage
