/* NVML's listings of processes cut down to the container's PIDs (pure: the real call is a
 * callback, so the size protocol is testable without a driver). */
#ifndef VGPU_NVML_FILTER_H
#define VGPU_NVML_FILTER_H

#include <stddef.h>

#include "nvml_api.h"
#include "pids_config.h"

/* One call of the real listing: up to *n records into buf (never NULL), *n set to the
 * records written, or to the records there are with NVML_ERROR_INSUFFICIENT_SIZE. */
typedef nvmlReturn_t (*vgpu_nvml_fetch)(void *ctx, unsigned int *n, void *buf);

/* Calls fetch into a buffer of its own, larger again each time the listing grew between
 * the calls (a few times at most), and keeps, in order, the records whose PID (an unsigned
 * int pid_at bytes into each record of elem bytes) pids holds. On NVML_SUCCESS *out is a
 * malloc'ed array of *kept records (free it; NULL when none). Any other answer of the real
 * call is returned as it is (NVML_ERROR_NOT_FOUND included), nothing kept. */
nvmlReturn_t vgpu_nvml_fetch_kept(vgpu_nvml_fetch fetch, void *ctx, size_t elem, size_t pid_at,
				  const struct vgpu_pids *pids, void **out, unsigned int *kept);

/* How a call tells its caller the size: every one takes the caller's array size in the count
 * and answers the records written; a NULL array or a count below the records sets the count
 * and answers NVML_ERROR_INSUFFICIENT_SIZE. With nothing to answer: a process list
 * NVML_SUCCESS, a sample query NVML_ERROR_NOT_FOUND (no sample since the time asked). A
 * session list also answers a count of 0 with NVML_SUCCESS and the count of sessions. */
enum vgpu_nvml_protocol { VGPU_NVML_LIST, VGPU_NVML_SAMPLES, VGPU_NVML_SESSIONS };

/* Hands the n kept records to the caller's dst and *count in the call's protocol. */
nvmlReturn_t vgpu_nvml_hand_out(const void *kept, unsigned int n, size_t elem, void *dst, unsigned int *count,
				enum vgpu_nvml_protocol protocol);

#endif
