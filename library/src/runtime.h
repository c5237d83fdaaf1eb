/* Process state of the library: decided once, on the first CUDA or NVML call (never at
 * load time), reset in a forked child. Everything comes from vgpu.config (config.h), read
 * then; the environment is never trusted for limits, GPUs or identity.
 *
 *  PASSTHROUGH  vgpu.config sets no limit on any GPU (an admin-access container): the hooks
 *               call the driver and change nothing (a GPU CUDA sees must still be listed).
 *  ENFORCE      limits set; directories present; registered; pids.config read; ledger open.
 *  REFUSED      vgpu.config is missing, unreadable or malformed; or limits are set but
 *               something needed to enforce them is missing; or CUDA sees a GPU the file
 *               does not list: the hooks fail and say why on stderr (once per process).
 *               Never exit(), never silently unlimited. */
#ifndef VGPU_RUNTIME_H
#define VGPU_RUNTIME_H

#include <stdatomic.h>
#include <stdint.h>

#include "core_bucket.h"
#include "config.h"
#include "ledger.h"
#include "nvml_api.h"
#include "pids_config.h"

enum vgpu_mode { VGPU_MODE_UNINIT = 0, VGPU_MODE_PASSTHROUGH, VGPU_MODE_ENFORCE, VGPU_MODE_REFUSED };

#define VGPU_MAX_CUDA_DEVICES 64

struct vgpu_runtime {
	_Atomic int mode;
	struct vgpu_config cfg;
	char refusal[768];
	_Atomic int refusal_printed;
	struct vgpu_ledger ledger;
	struct core_bucket *buckets; /* VGPU_MAX_DEVICES, in /tmp/.vgpu_lock; NULL without core limits */
	struct vgpu_pids pids;
	_Atomic int cuda_mapped;     /* cuda_index[] is filled */
	int cuda_count;
	int cuda_index[VGPU_MAX_CUDA_DEVICES]; /* CUDA ordinal -> position in cfg.dev */
	int only_index;              /* position 0 when exactly one GPU is listed, else -1 */
	_Atomic int launch_gate;     /* enum vgpu_gate, for the launch hooks' fast path */
};

enum vgpu_gate { VGPU_GATE_UNKNOWN = 0, VGPU_GATE_OPEN, VGPU_GATE_LIMITED, VGPU_GATE_REFUSED };

extern struct vgpu_runtime vgpu_rt;

/* Decides the mode on first use; one atomic load afterwards. Never calls the CUDA driver. */
int vgpu_runtime_mode(void);

/* After the driver is initialised: maps CUDA ordinals to the config's GPUs by UUID. A
 * visible GPU that no gpu line names makes the process REFUSED. Returns the mode. */
int vgpu_runtime_map_cuda(void);

/* Config position (index into cfg.dev, the ledger and the buckets) of the calling thread's
 * current CUDA device, or -1 (no context, unmapped). */
int vgpu_runtime_current_index(void);

/* Config position of a CUDA ordinal, or -1. */
int vgpu_runtime_index_of_ordinal(int ordinal);

/* Config position of an NVML device handle (by UUID, cached), or -1. */
int vgpu_runtime_index_of_nvml(nvmlDevice_t dev);

/* Prints the refusal once per process. */
void vgpu_runtime_report_refusal(void);

/* Re-reads pids.config when it changed (checked at most every 200 ms). */
void vgpu_runtime_refresh_pids(void);

#endif
