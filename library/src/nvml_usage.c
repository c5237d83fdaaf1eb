#include "nvml_usage.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "hook_table.h"
#include "hooks.h"
#include "log.h"
#include "nvml_samples.h"

int vgpu_nvml_ready(void)
{
	static _Atomic int state; /* 0 unknown, 1 ready, -1 failed */
	int s = atomic_load(&state);
	if (s != 0)
		return s > 0 ? 0 : -1;
	/* The real nvmlInit_v2 is reference counted: the application's own init/shutdown
	 * pairs stay balanced; this one is never shut down. */
	nvmlReturn_t (*init)(void) = REAL(nvmlInit_v2);
	nvmlReturn_t r = init != NULL ? init() : NVML_ERROR_NOT_FOUND;
	if (r != NVML_SUCCESS)
		vgpu_log_warn("NVML is not usable (%d): unseen driver memory and the core limit's "
			      "measurements are unavailable", r);
	atomic_store(&state, r == NVML_SUCCESS ? 1 : -1);
	return r == NVML_SUCCESS ? 0 : -1;
}

nvmlDevice_t vgpu_nvml_device(const char *uuid)
{
	nvmlDevice_t dev = NULL;
	if (vgpu_nvml_ready() != 0 || USED(nvmlDeviceGetHandleByUUID) == NULL)
		return NULL;
	if (USED(nvmlDeviceGetHandleByUUID)(uuid, &dev) != NVML_SUCCESS)
		return NULL;
	return dev;
}

int vgpu_nvml_container_memory(nvmlDevice_t dev, const struct vgpu_pids *pids, uint64_t *bytes)
{
	nvmlReturn_t (*list)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *) =
		REAL(nvmlDeviceGetComputeRunningProcesses_v3);
	if (list == NULL)
		list = REAL(nvmlDeviceGetComputeRunningProcesses_v2);
	if (list == NULL)
		return -1;
	unsigned int cap = 64;
	for (int tries = 0; tries < 4; tries++) {
		nvmlProcessInfo_t *infos = calloc(cap, sizeof(*infos));
		if (infos == NULL)
			return -1;
		unsigned int n = cap;
		nvmlReturn_t r = list(dev, &n, infos);
		if (r == NVML_ERROR_INSUFFICIENT_SIZE) {
			free(infos);
			cap = n + 16;
			continue;
		}
		if (r != NVML_SUCCESS) {
			free(infos);
			return -1;
		}
		uint64_t sum = 0;
		for (unsigned int i = 0; i < n && i < cap; i++)
			if (vgpu_pids_contains(pids, infos[i].pid) && infos[i].usedGpuMemory != ~0ull)
				sum += infos[i].usedGpuMemory;
		free(infos);
		*bytes = sum;
		return 0;
	}
	return -1;
}

int vgpu_nvml_container_util(nvmlDevice_t dev, const struct vgpu_pids *pids, uint64_t *last_seen_us,
			     double *util_pct)
{
	nvmlReturn_t (*get)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *, unsigned long long) =
		REAL(nvmlDeviceGetProcessUtilization);
	if (get == NULL)
		return -1;
	unsigned int n = 0;
	nvmlReturn_t r = get(dev, NULL, &n, *last_seen_us);
	if (r == NVML_ERROR_NOT_FOUND) {
		*util_pct = 0; /* nothing ran since the last sample */
		return 0;
	}
	if (r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE)
		return -1;
	if (n == 0) {
		*util_pct = 0;
		return 0;
	}
	n += 8;
	nvmlProcessUtilizationSample_t *s = calloc(n, sizeof(*s));
	if (s == NULL)
		return -1;
	r = get(dev, s, &n, *last_seen_us);
	if (r == NVML_ERROR_NOT_FOUND) {
		free(s);
		*util_pct = 0;
		return 0;
	}
	if (r != NVML_SUCCESS) {
		free(s);
		return -1;
	}
	uint64_t newest = *last_seen_us;
	/* The driver's sampling period, learnt from the samples (vgpu_util_from_samples): one
	 * for the process, as the driver samples every GPU at the same period. */
	static _Atomic uint64_t period_us;
	uint64_t period = atomic_load_explicit(&period_us, memory_order_relaxed);
	vgpu_util_from_samples(s, n, pids, *last_seen_us, &newest, util_pct, &period);
	atomic_store_explicit(&period_us, period, memory_order_relaxed);
	free(s);
	*last_seen_us = newest;
	return 0;
}
