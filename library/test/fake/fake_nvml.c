/* TEST DOUBLE: a fake libnvidia-ml.so.1 over the same shared state as the fake libcuda.
 * Processes are reported with PIDs offset by FAKE_PID_OFFSET (host PIDs as seen from a
 * container); dead and zombie processes are not listed (the driver frees their memory);
 * utilisation is the busy share of each process's launches in the sampling window. Every
 * process of the state file is on the device, whoever's container it is in: the compute,
 * graphics and MPS lists, the detail list, both sample queries, accounting and the encoder's
 * and frame-buffer capture's sessions list the same processes (the neighbours a container must
 * not see). */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "../../src/nvml_api.h"
#include "fake_state.h"

#define API __attribute__((visibility("default")))

struct fake_dev { int index; };
static struct fake_dev devs[FAKE_MAX_DEV];
static int inited;

static int dev_index(nvmlDevice_t d)
{
	struct fake_dev *f = (struct fake_dev *)d;
	if (f < devs || f >= devs + FAKE_MAX_DEV || (unsigned)f->index >= fake_state()->ndev)
		return -1;
	return f->index;
}

API nvmlReturn_t nvmlInit_v2(void)
{
	fake_state();
	for (int i = 0; i < FAKE_MAX_DEV; i++)
		devs[i].index = i;
	inited++;
	return NVML_SUCCESS;
}
API nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }
API nvmlReturn_t nvmlShutdown(void) { if (inited) inited--; return NVML_SUCCESS; }

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (!inited)
		return NVML_ERROR_UNINITIALIZED;
	*count = fake_state()->ndev;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	if (!inited)
		return NVML_ERROR_UNINITIALIZED;
	if (index >= fake_state()->ndev)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = (nvmlDevice_t)&devs[index];
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
	if (!inited)
		return NVML_ERROR_UNINITIALIZED;
	struct fake_state *s = fake_state();
	for (unsigned i = 0; i < s->ndev; i++) {
		if (strcasecmp(s->uuid[i], uuid) == 0) {
			*device = (nvmlDevice_t)&devs[i];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	int i = dev_index(device);
	if (i < 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	if ((unsigned)snprintf(uuid, length, "%s", fake_state()->uuid[i]) >= length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	return NVML_SUCCESS;
}

static unsigned long long used_on(int dev)
{
	struct fake_state *s = fake_state();
	unsigned long long used = 0;
	fake_lock();
	for (int p = 0; p < FAKE_MAX_PROCS; p++)
		if (s->procs[p].pid != 0 && fake_pid_alive(s->procs[p].pid))
			used += s->procs[p].used[dev];
	fake_unlock();
	return used;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m)
{
	int i = dev_index(device);
	if (i < 0 || m == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	m->total = fake_state()->total[i];
	m->used = used_on(i);
	m->free = m->used < m->total ? m->total - m->used : 0;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m)
{
	int i = dev_index(device);
	if (i < 0 || m == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	m->total = fake_state()->total[i];
	m->reserved = 0;
	m->used = used_on(i);
	m->free = m->used < m->total ? m->total - m->used : 0;
	return NVML_SUCCESS;
}

/* Fills up to *count records of elem bytes (pid first, then usedGpuMemory where a record
 * has room for it: not in accounting's bare PIDs). */
static nvmlReturn_t list(nvmlDevice_t device, unsigned int *count, void *infos, size_t elem)
{
	int dev = dev_index(device);
	if (dev < 0 || count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct fake_state *s = fake_state();
	unsigned int n = 0, cap = infos ? *count : 0;
	fake_lock();
	for (int p = 0; p < FAKE_MAX_PROCS; p++) {
		struct fake_proc *fp = &s->procs[p];
		if (fp->pid == 0 || fp->used[dev] == 0 || !fake_pid_alive(fp->pid))
			continue;
		if (n < cap) {
			unsigned char *rec = (unsigned char *)infos + n * elem;
			memset(rec, 0, elem);
			unsigned int pid = (unsigned int)fp->pid + fake_pid_offset();
			unsigned long long used = fp->used[dev];
			memcpy(rec, &pid, sizeof(pid));
			if (elem >= 8 + sizeof(used))
				memcpy(rec + 8, &used, sizeof(used));
		}
		n++;
	}
	fake_unlock();
	*count = n;
	return n > cap ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *i)
{
	return list(d, c, i, sizeof(*i));
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i)
{
	return list(d, c, i, sizeof(*i));
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i)
{
	return list(d, c, i, sizeof(*i));
}

/* The graphics and MPS lists: the same processes (a fake context is all of these). */
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *i)
{
	return list(d, c, i, sizeof(*i));
}
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i)
{
	return list(d, c, i, sizeof(*i));
}
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i)
{
	return list(d, c, i, sizeof(*i));
}
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *i)
{
	return list(d, c, i, sizeof(*i));
}
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i)
{
	return list(d, c, i, sizeof(*i));
}
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i)
{
	return list(d, c, i, sizeof(*i));
}

API nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t d, nvmlProcessDetailList_t *l)
{
	if (l == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (l->version != nvmlProcessDetailList_v1)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	return list(d, &l->numProcArrayEntries, l->procArray, sizeof(*l->procArray));
}

/* One encoder and one capture session per process (pid the second member); a count of 0
 * asks for the count, answered NVML_SUCCESS, as NVML documents for these two. */
static nvmlReturn_t sessions(nvmlDevice_t device, unsigned int *count, void *infos, size_t elem)
{
	int dev = dev_index(device);
	if (dev < 0 || count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct fake_state *s = fake_state();
	unsigned int n = 0, cap = infos ? *count : 0;
	fake_lock();
	for (int p = 0; p < FAKE_MAX_PROCS; p++) {
		struct fake_proc *fp = &s->procs[p];
		if (fp->pid == 0 || fp->used[dev] == 0 || !fake_pid_alive(fp->pid))
			continue;
		if (n < cap) {
			unsigned int rec[2] = { (unsigned int)p + 1, (unsigned int)fp->pid + fake_pid_offset() };
			memset((unsigned char *)infos + n * elem, 0, elem);
			memcpy((unsigned char *)infos + n * elem, rec, sizeof(rec));
		}
		n++;
	}
	fake_unlock();
	int asked = *count == 0;
	*count = n;
	return asked || n <= cap ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

API nvmlReturn_t nvmlDeviceGetEncoderSessions(nvmlDevice_t d, unsigned int *c, nvmlEncoderSessionInfo_t *i)
{
	return sessions(d, c, i, sizeof(*i));
}
API nvmlReturn_t nvmlDeviceGetFBCSessions(nvmlDevice_t d, unsigned int *c, nvmlFBCSessionInfo_t *i)
{
	return sessions(d, c, i, sizeof(*i));
}

/* Accounting: every process of the state that is still there (a fake keeps no records of
 * the dead); its statistics are its memory on the device. */
API nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t device, unsigned int *count, unsigned int *pids)
{
	return list(device, count, pids, sizeof(*pids));
}

API nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t device, unsigned int pid, nvmlAccountingStats_t *stats)
{
	int dev = dev_index(device);
	if (dev < 0 || stats == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct fake_state *s = fake_state();
	nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
	fake_lock();
	for (int p = 0; p < FAKE_MAX_PROCS; p++) {
		struct fake_proc *fp = &s->procs[p];
		if (fp->pid == 0 || (unsigned int)fp->pid + fake_pid_offset() != pid || !fake_pid_alive(fp->pid))
			continue;
		*stats = (nvmlAccountingStats_t){ .maxMemoryUsage = fp->used[dev], .isRunning = 1 };
		r = NVML_SUCCESS;
		break;
	}
	fake_unlock();
	return r;
}

/* One sample per process: its busy share of [max(lastSeen, now - 1 s), now]. Timestamps
 * are CLOCK_MONOTONIC microseconds (the library only hands them back). */
struct fake_sample { unsigned int pid, sm; unsigned long long ts; };

static nvmlReturn_t samples_of(nvmlDevice_t device, unsigned long long last_seen, struct fake_sample *out, int *n)
{
	int dev = dev_index(device);
	if (dev < 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct fake_state *s = fake_state();
	uint64_t now = fake_now_ns();
	uint64_t from = last_seen * 1000ull;
	if (from + 1000000000ull < now)
		from = now - 1000000000ull;
	if (from >= now)
		return NVML_ERROR_NOT_FOUND;
	struct { int pid; uint64_t busy; } acc[64];
	int nacc = 0;
	fake_lock();
	uint64_t head = s->ring_head[dev];
	for (uint64_t k = head > FAKE_RING ? head - FAKE_RING : 0; k < head; k++) {
		const struct fake_interval *iv = &s->ring[dev][k % FAKE_RING];
		uint64_t a = iv->start_ns > from ? iv->start_ns : from;
		uint64_t b = iv->end_ns < now ? iv->end_ns : now;
		if (b <= a)
			continue;
		int j = 0;
		while (j < nacc && acc[j].pid != iv->pid)
			j++;
		if (j == nacc) {
			if (nacc == 64)
				continue;
			acc[nacc].pid = iv->pid;
			acc[nacc].busy = 0;
			nacc++;
		}
		acc[j].busy += b - a;
	}
	fake_unlock();
	if (nacc == 0)
		return NVML_ERROR_NOT_FOUND;
	for (int j = 0; j < nacc; j++)
		out[j] = (struct fake_sample){
			.pid = (unsigned)acc[j].pid + fake_pid_offset(),
			.sm = (unsigned)((acc[j].busy * 100 + (now - from) / 2) / (now - from)),
			.ts = now / 1000ull,
		};
	*n = nacc;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
						 unsigned int *count, unsigned long long last_seen)
{
	if (count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct fake_sample f[64];
	int n;
	nvmlReturn_t r = samples_of(device, last_seen, f, &n);
	if (r != NVML_SUCCESS)
		return r;
	if (samples == NULL || *count < (unsigned)n) {
		*count = (unsigned)n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (int j = 0; j < n; j++)
		samples[j] = (nvmlProcessUtilizationSample_t){ .pid = f[j].pid, .timeStamp = f[j].ts, .smUtil = f[j].sm };
	*count = (unsigned)n;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device, nvmlProcessesUtilizationInfo_t *info)
{
	if (info == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (info->version != nvmlProcessesUtilizationInfo_v1)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	struct fake_sample f[64];
	int n;
	nvmlReturn_t r = samples_of(device, info->lastSeenTimeStamp, f, &n);
	if (r != NVML_SUCCESS)
		return r;
	if (info->procUtilArray == NULL || info->processSamplesCount < (unsigned)n) {
		info->processSamplesCount = (unsigned)n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (int j = 0; j < n; j++)
		info->procUtilArray[j] = (nvmlProcessUtilizationInfo_v1_t){ .timeStamp = f[j].ts, .pid = f[j].pid,
									   .smUtil = f[j].sm };
	info->processSamplesCount = (unsigned)n;
	return NVML_SUCCESS;
}
