/* NVML as the container should see it: its limit as the device's memory, its own usage,
 * and only its own processes (the host PIDs of pids.config). */
#include <stdlib.h>
#include <string.h>

#include "hook_table.h"
#include "hooks.h"
#include "mem_account.h"
#include "runtime.h"

static int nvml_refused(void)
{
	if (vgpu_runtime_mode() == VGPU_MODE_REFUSED) {
		vgpu_runtime_report_refusal();
		return 1;
	}
	return 0;
}

static void clamp_nvml(nvmlDevice_t device, unsigned long long *total, unsigned long long *free,
		       unsigned long long *used)
{
	uint64_t limit, in_use;
	if (vgpu_mem_view(vgpu_runtime_index_of_nvml(device), &limit, &in_use) != 0)
		return;
	uint64_t f = *free, t = *total;
	vgpu_mem_clamp(limit, in_use, &f, &t);
	*total = t;
	*free = f;
	*used = t - f;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	__typeof__(&nvmlDeviceGetMemoryInfo) real = REAL(nvmlDeviceGetMemoryInfo);
	if (real == NULL)
		return NVML_ERROR_UNKNOWN;
	if (nvml_refused())
		return NVML_ERROR_NO_PERMISSION;
	nvmlReturn_t r = real(device, memory);
	if (r == NVML_SUCCESS && memory != NULL)
		clamp_nvml(device, &memory->total, &memory->free, &memory->used);
	return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	__typeof__(&nvmlDeviceGetMemoryInfo_v2) real = REAL(nvmlDeviceGetMemoryInfo_v2);
	if (real == NULL)
		return NVML_ERROR_UNKNOWN;
	if (nvml_refused())
		return NVML_ERROR_NO_PERMISSION;
	nvmlReturn_t r = real(device, memory);
	if (r == NVML_SUCCESS && memory != NULL) {
		unsigned long long before = memory->total;
		clamp_nvml(device, &memory->total, &memory->free, &memory->used);
		if (memory->total != before)
			memory->reserved = 0; /* the driver's reservation is outside the container's share */
	}
	return r;
}

/* Calls the real listing into a buffer of its own, keeps the container's PIDs, copies
 * them out with NVML's INSUFFICIENT_SIZE convention. elem: size of one record. */
typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, void *);

static nvmlReturn_t filtered_list(list_fn real, size_t elem, nvmlDevice_t device, unsigned int *count, void *infos)
{
	if (count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	unsigned int n = 0;
	nvmlReturn_t r = real(device, &n, NULL);
	if (r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE)
		return r;
	unsigned int cap = n + 16;
	unsigned char *buf = calloc(cap, elem);
	if (buf == NULL)
		return NVML_ERROR_UNKNOWN;
	n = cap;
	r = n == 0 ? NVML_SUCCESS : real(device, &n, buf);
	if (r != NVML_SUCCESS) {
		free(buf);
		return r;
	}
	vgpu_runtime_refresh_pids();
	unsigned int kept = 0;
	for (unsigned int i = 0; i < n; i++) {
		unsigned int pid;
		memcpy(&pid, buf + i * elem, sizeof(pid)); /* pid is the first member of every version */
		if (vgpu_pids_contains(&vgpu_rt.pids, pid)) {
			if (kept != i)
				memmove(buf + kept * elem, buf + i * elem, elem);
			kept++;
		}
	}
	if (infos == NULL || *count < kept) {
		*count = kept;
		free(buf);
		return kept == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
	}
	memcpy(infos, buf, kept * elem);
	*count = kept;
	free(buf);
	return NVML_SUCCESS;
}

#define PROCESS_LIST_HOOK(name, type)                                                                 \
	nvmlReturn_t name(nvmlDevice_t device, unsigned int *count, type *infos)                      \
	{                                                                                             \
		__typeof__(&name) real = REAL(name);                                                  \
		if (real == NULL)                                                                     \
			return NVML_ERROR_UNKNOWN;                                                    \
		if (nvml_refused())                                                                   \
			return NVML_ERROR_NO_PERMISSION;                                              \
		if (vgpu_runtime_mode() != VGPU_MODE_ENFORCE)                                        \
			return real(device, count, infos);                                            \
		return filtered_list((list_fn)(void *)real, sizeof(type), device, count, infos);      \
	}

PROCESS_LIST_HOOK(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
PROCESS_LIST_HOOK(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t)
PROCESS_LIST_HOOK(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
