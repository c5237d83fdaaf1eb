/* What NVML says about the container's processes (the PIDs of pids.config), through the
 * real NVML, never through the hooks. */
#ifndef VGPU_NVML_USAGE_H
#define VGPU_NVML_USAGE_H

#include <stdint.h>

#include "nvml_api.h"
#include "pids_config.h"

/* Initialises the real NVML once for the library's own queries. 0 on success. */
int vgpu_nvml_ready(void);

/* Device handle for a UUID through the real NVML, or NULL. */
nvmlDevice_t vgpu_nvml_device(const char *uuid);

/* Sum of usedGpuMemory of the container's PIDs on the device. 0 on success. */
int vgpu_nvml_container_memory(nvmlDevice_t dev, const struct vgpu_pids *pids, uint64_t *bytes);

/* SM utilisation (percent of the device) of the container's PIDs since *last_seen_us
 * (vgpu_util_from_samples); updates *last_seen_us. 0 on success; no sample since then leaves
 * *last_seen_us as it was (nothing new measured). */
int vgpu_nvml_container_util(nvmlDevice_t dev, const struct vgpu_pids *pids, uint64_t *last_seen_us,
			     double *util_pct);

#endif
