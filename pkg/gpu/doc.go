// Package gpu is the kubelet plugin's GPU inventory: which GPUs the node has, what they are, and
// when their health changes.
//
// Everything is read through github.com/NVIDIA/go-nvml. There are two sources:
//
//   - NewNVML reads the real driver (libnvidia-ml.so.1, opened on first use);
//   - NewSimulated serves the same NVML calls from go-nvml's own mock servers (a DGX A100, H100,
//     H200 or B200), so nodes and tests without GPUs run the very code that reads a real GPU.
//     It opens no library and touches no device: it is safe in a plugin pod on any node.
//
// Both are one type (nvmlSource) over an nvml.Interface; the simulated source only supplies the
// interface. Health follows NVML events (XID critical errors, double-bit ECC errors, GPU
// unavailable); which XIDs are ignored, which make a GPU unhealthy and which are fatal is decided
// in xid.go, once, for both sources.
//
// Per-process usage (ProcessUtilization, ProcessMemory) is NVML's per-process utilisation
// samples and compute-process list. A simulated GPU runs the processes SetProcesses names and
// reports a fixed, per-PID utilisation for each within its share of its container's cores
// (SimulatedSMUtil), so tests can assert figures and a well-behaved container is never over its
// core limit; SetProcessUsage sets what a misbehaving one uses.
package gpu
