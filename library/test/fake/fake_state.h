/* TEST DOUBLE. State shared by the fake libcuda.so.1 and libnvidia-ml.so.1 across the
 * processes of one test: devices, per-process usage, the peak of the devices' total usage
 * and a ring of kernel "busy" intervals from which utilisation is computed.
 *
 * Env: FAKE_GPU_STATE (file, required), FAKE_GPU_DEVICES ("uuid:MiB,..."; default one
 * 16 GiB device), FAKE_NS_PER_BLOCK (busy time per block, default 1000; 0 = launches are
 * not recorded), FAKE_CTX_OVERHEAD (bytes a context costs, invisible to the hooks),
 * FAKE_PID_OFFSET (NVML reports pid + offset, like host PIDs seen from a container),
 * CUDA_VISIBLE_DEVICES (comma-separated device indices: the CUDA ordinals, in that order,
 * like the real driver's; NVML still lists every device, by its index). Up to FAKE_MAX_DEV
 * devices, so a GPU at NVML index 16 or above can be presented. */
#ifndef FAKE_STATE_H
#define FAKE_STATE_H

#include <stdint.h>

#define FAKE_MAX_DEV 20
#define FAKE_MAX_PROCS 256
#define FAKE_RING 8192
#define FAKE_DEFAULT_UUID "GPU-11111111-2222-3333-4444-555555555555"

struct fake_proc {
	int32_t pid;
	int32_t ctx_charged;
	uint64_t used[FAKE_MAX_DEV];
};

struct fake_interval {
	int32_t pid;
	int32_t pad;
	uint64_t start_ns, end_ns;
};

struct fake_state {
	uint32_t magic, ndev;
	char uuid[FAKE_MAX_DEV][48];
	uint64_t total[FAKE_MAX_DEV];
	uint64_t peak[FAKE_MAX_DEV];
	uint64_t gpu_free_ns[FAKE_MAX_DEV];
	uint64_t ring_head[FAKE_MAX_DEV];
	uint64_t busy_total_ns[FAKE_MAX_DEV];
	struct fake_proc procs[FAKE_MAX_PROCS];
	struct fake_interval ring[FAKE_MAX_DEV][FAKE_RING];
};

struct fake_state *fake_state(void);
void fake_lock(void);
void fake_unlock(void);
uint64_t fake_now_ns(void);
struct fake_proc *fake_self(void); /* under the lock */
int fake_pid_alive(int pid);
unsigned fake_pid_offset(void);
void fake_charge(int dev, int64_t delta); /* under the lock: usage and peak */

#endif
