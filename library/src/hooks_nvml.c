/* NVML as the container should see it: its limit as the device's memory, its own usage,
 * and only its own processes (the host PIDs of pids.config) in every list of processes, of
 * their samples, sessions and accounting. The device's utilisation (nvmlDeviceGetUtilizationRates)
 * is not hooked: it is the one figure the container shares with its neighbours. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "hook_table.h"
#include "hooks.h"
#include "mem_account.h"
#include "nvml_filter.h"
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

/* The process lists (compute, graphics, MPS compute; every version): the real listing
 * into a buffer of its own, the container's PIDs kept, handed out with NVML's "count in,
 * count out, NVML_ERROR_INSUFFICIENT_SIZE" convention (a NULL buffer asks for the count).
 * elem: the size of one record of the version; the pid is the first member of every one. */
typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, void *);

struct list_call {
	list_fn real;
	nvmlDevice_t device;
};

static nvmlReturn_t fetch_list(void *ctx, unsigned int *n, void *buf)
{
	struct list_call *c = ctx;
	return c->real(c->device, n, buf);
}

static nvmlReturn_t filtered_list(list_fn real, size_t elem, size_t pid_at, enum vgpu_nvml_protocol protocol,
				  nvmlDevice_t device, unsigned int *count, void *infos)
{
	if (count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct list_call c = { real, device };
	void *kept;
	unsigned int n;
	vgpu_runtime_refresh_pids();
	nvmlReturn_t r = vgpu_nvml_fetch_kept(fetch_list, &c, elem, pid_at, &vgpu_rt.pids, &kept, &n);
	if (r != NVML_SUCCESS)
		return r;
	r = vgpu_nvml_hand_out(kept, n, elem, infos, count, protocol);
	free(kept);
	return r;
}

#define FILTERED_LIST_HOOK(name, type, pid_at, protocol)                                           \
	nvmlReturn_t name(nvmlDevice_t device, unsigned int *count, type *infos)                      \
	{                                                                                             \
		__typeof__(&name) real = REAL(name);                                                  \
		if (real == NULL)                                                                     \
			return NVML_ERROR_UNKNOWN;                                                    \
		if (nvml_refused())                                                                   \
			return NVML_ERROR_NO_PERMISSION;                                              \
		if (vgpu_runtime_mode() != VGPU_MODE_ENFORCE)                                        \
			return real(device, count, infos);                                            \
		return filtered_list((list_fn)(void *)real, sizeof(type), pid_at, protocol, device,  \
				     count, infos);                                                   \
	}
#define PROCESS_LIST_HOOK(name, type) FILTERED_LIST_HOOK(name, type, 0, VGPU_NVML_LIST)

PROCESS_LIST_HOOK(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
PROCESS_LIST_HOOK(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t)
PROCESS_LIST_HOOK(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
PROCESS_LIST_HOOK(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t)
PROCESS_LIST_HOOK(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t)
PROCESS_LIST_HOOK(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)
PROCESS_LIST_HOOK(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t)
PROCESS_LIST_HOOK(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_t)
PROCESS_LIST_HOOK(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t)

/* The mode-selected list of one struct (version, mode, count, array): the real call gets a
 * copy with the library's array, the caller's struct only the count and its own records. */
struct detail_call {
	__typeof__(&nvmlDeviceGetRunningProcessDetailList) real;
	nvmlDevice_t device;
	const nvmlProcessDetailList_t *asked;
};

static nvmlReturn_t fetch_details(void *ctx, unsigned int *n, void *buf)
{
	struct detail_call *c = ctx;
	nvmlProcessDetailList_t l = *c->asked;
	l.numProcArrayEntries = *n;
	l.procArray = buf;
	nvmlReturn_t r = c->real(c->device, &l);
	*n = l.numProcArrayEntries;
	return r;
}

nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_t *plist)
{
	__typeof__(&nvmlDeviceGetRunningProcessDetailList) real = REAL(nvmlDeviceGetRunningProcessDetailList);
	if (real == NULL)
		return NVML_ERROR_UNKNOWN;
	if (nvml_refused())
		return NVML_ERROR_NO_PERMISSION;
	if (vgpu_runtime_mode() != VGPU_MODE_ENFORCE)
		return real(device, plist);
	if (plist == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct detail_call c = { real, device, plist };
	void *kept;
	unsigned int n;
	vgpu_runtime_refresh_pids();
	nvmlReturn_t r = vgpu_nvml_fetch_kept(fetch_details, &c, sizeof(nvmlProcessDetail_v1_t), 0, &vgpu_rt.pids,
					      &kept, &n);
	if (r != NVML_SUCCESS)
		return r;
	r = vgpu_nvml_hand_out(kept, n, sizeof(nvmlProcessDetail_v1_t), plist->procArray, &plist->numProcArrayEntries,
			       VGPU_NVML_LIST);
	free(kept);
	return r;
}

/* The video encoder's and the frame-buffer capture's sessions, each with its process's PID
 * (not their first member); a count of 0 asks for the count (answered NVML_SUCCESS). */
FILTERED_LIST_HOOK(nvmlDeviceGetEncoderSessions, nvmlEncoderSessionInfo_t,
		   offsetof(nvmlEncoderSessionInfo_t, pid), VGPU_NVML_SESSIONS)
FILTERED_LIST_HOOK(nvmlDeviceGetFBCSessions, nvmlFBCSessionInfo_t, offsetof(nvmlFBCSessionInfo_t, pid),
		   VGPU_NVML_SESSIONS)

/* Accounting: the PIDs with statistics (their records are the PIDs themselves), and one
 * PID's statistics, which a neighbour's PID does not have as far as the container can tell. */
PROCESS_LIST_HOOK(nvmlDeviceGetAccountingPids, unsigned int)

nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t device, unsigned int pid, nvmlAccountingStats_t *stats)
{
	__typeof__(&nvmlDeviceGetAccountingStats) real = REAL(nvmlDeviceGetAccountingStats);
	if (real == NULL)
		return NVML_ERROR_UNKNOWN;
	if (nvml_refused())
		return NVML_ERROR_NO_PERMISSION;
	if (vgpu_runtime_mode() == VGPU_MODE_ENFORCE) {
		vgpu_runtime_refresh_pids();
		if (!vgpu_pids_contains(&vgpu_rt.pids, pid))
			return NVML_ERROR_NOT_FOUND;
	}
	return real(device, pid, stats);
}

/* The per-process utilisation samples: only the container's; none of them since the time
 * asked is NVML's "no sample" answer, NVML_ERROR_NOT_FOUND, as on a GPU of its own. */
struct samples_call {
	__typeof__(&nvmlDeviceGetProcessUtilization) real;
	nvmlDevice_t device;
	unsigned long long last_seen;
};

static nvmlReturn_t fetch_samples(void *ctx, unsigned int *n, void *buf)
{
	struct samples_call *c = ctx;
	return c->real(c->device, buf, n, c->last_seen);
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
					     unsigned int *count, unsigned long long lastSeenTimeStamp)
{
	__typeof__(&nvmlDeviceGetProcessUtilization) real = REAL(nvmlDeviceGetProcessUtilization);
	if (real == NULL)
		return NVML_ERROR_UNKNOWN;
	if (nvml_refused())
		return NVML_ERROR_NO_PERMISSION;
	if (vgpu_runtime_mode() != VGPU_MODE_ENFORCE)
		return real(device, samples, count, lastSeenTimeStamp);
	if (count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct samples_call c = { real, device, lastSeenTimeStamp };
	void *kept;
	unsigned int n;
	vgpu_runtime_refresh_pids();
	nvmlReturn_t r = vgpu_nvml_fetch_kept(fetch_samples, &c, sizeof(*samples), 0, &vgpu_rt.pids, &kept, &n);
	if (r != NVML_SUCCESS)
		return r;
	r = vgpu_nvml_hand_out(kept, n, sizeof(*samples), samples, count, VGPU_NVML_SAMPLES);
	free(kept);
	return r;
}

struct util_info_call {
	__typeof__(&nvmlDeviceGetProcessesUtilizationInfo) real;
	nvmlDevice_t device;
	const nvmlProcessesUtilizationInfo_t *asked;
};

static nvmlReturn_t fetch_util_info(void *ctx, unsigned int *n, void *buf)
{
	struct util_info_call *c = ctx;
	nvmlProcessesUtilizationInfo_t u = *c->asked;
	u.processSamplesCount = *n;
	u.procUtilArray = buf;
	nvmlReturn_t r = c->real(c->device, &u);
	*n = u.processSamplesCount;
	return r;
}

nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device, nvmlProcessesUtilizationInfo_t *info)
{
	__typeof__(&nvmlDeviceGetProcessesUtilizationInfo) real = REAL(nvmlDeviceGetProcessesUtilizationInfo);
	if (real == NULL)
		return NVML_ERROR_UNKNOWN;
	if (nvml_refused())
		return NVML_ERROR_NO_PERMISSION;
	if (vgpu_runtime_mode() != VGPU_MODE_ENFORCE)
		return real(device, info);
	if (info == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct util_info_call c = { real, device, info };
	void *kept;
	unsigned int n;
	vgpu_runtime_refresh_pids();
	nvmlReturn_t r = vgpu_nvml_fetch_kept(fetch_util_info, &c, sizeof(nvmlProcessUtilizationInfo_v1_t),
					      offsetof(nvmlProcessUtilizationInfo_v1_t, pid), &vgpu_rt.pids, &kept, &n);
	if (r != NVML_SUCCESS)
		return r;
	r = vgpu_nvml_hand_out(kept, n, sizeof(nvmlProcessUtilizationInfo_v1_t), info->procUtilArray,
			       &info->processSamplesCount, VGPU_NVML_SAMPLES);
	free(kept);
	return r;
}
