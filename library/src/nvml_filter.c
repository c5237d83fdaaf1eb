#include "nvml_filter.h"

#include <stdlib.h>
#include <string.h>

#define FIRST_CAP 64u
#define MAX_CAP (1u << 20) /* records: far above any GPU's processes */
#define TRIES 5

nvmlReturn_t vgpu_nvml_fetch_kept(vgpu_nvml_fetch fetch, void *ctx, size_t elem, size_t pid_at,
				  const struct vgpu_pids *pids, void **out, unsigned int *kept)
{
	*out = NULL;
	*kept = 0;
	unsigned int cap = FIRST_CAP;
	for (int t = 0; t < TRIES; t++) {
		unsigned char *buf = calloc(cap, elem);
		if (buf == NULL)
			return NVML_ERROR_UNKNOWN;
		unsigned int n = cap;
		nvmlReturn_t r = fetch(ctx, &n, buf);
		if (r == NVML_ERROR_INSUFFICIENT_SIZE) {
			free(buf);
			/* the listing grew since the last call: room for it and a few more */
			unsigned int want = n > cap ? n : cap;
			if (want > MAX_CAP - 16)
				return NVML_ERROR_UNKNOWN;
			cap = want + 16;
			continue;
		}
		if (r != NVML_SUCCESS) {
			free(buf);
			return r;
		}
		if (n > cap)
			n = cap; /* never trust a count past the buffer */
		unsigned int k = 0;
		for (unsigned int i = 0; i < n; i++) {
			unsigned int pid;
			memcpy(&pid, buf + (size_t)i * elem + pid_at, sizeof(pid));
			if (pid != 0 && vgpu_pids_contains(pids, pid)) {
				if (k != i)
					memmove(buf + (size_t)k * elem, buf + (size_t)i * elem, elem);
				k++;
			}
		}
		if (k == 0) {
			free(buf);
			return NVML_SUCCESS;
		}
		*out = buf;
		*kept = k;
		return NVML_SUCCESS;
	}
	return NVML_ERROR_UNKNOWN; /* it kept growing faster than it could be read */
}

nvmlReturn_t vgpu_nvml_hand_out(const void *kept, unsigned int n, size_t elem, void *dst, unsigned int *count,
				enum vgpu_nvml_protocol protocol)
{
	if (n == 0) {
		*count = 0;
		return protocol == VGPU_NVML_SAMPLES ? NVML_ERROR_NOT_FOUND : NVML_SUCCESS;
	}
	if (protocol == VGPU_NVML_SESSIONS && *count == 0) {
		*count = n;
		return NVML_SUCCESS;
	}
	if (dst == NULL || *count < n) {
		*count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	memcpy(dst, kept, (size_t)n * elem);
	*count = n;
	return NVML_SUCCESS;
}
