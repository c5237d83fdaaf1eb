/* Memory accounting shared by the CUDA and NVML hooks: reserve-then-allocate against the
 * container's ledger, record/forget allocations, and the usage the container should see. */
#ifndef VGPU_MEM_ACCOUNT_H
#define VGPU_MEM_ACCOUNT_H

#include <stdint.h>

#include "alloc_map.h"
#include "cuda_api.h"

struct vgpu_mem_op {
	int index;         /* env index accounted, -1 = nothing accounted */
	uint64_t reserved; /* bytes reserved in the ledger */
};

/* Before an allocation of bytes on a CUDA ordinal (-1: the current context's device).
 * CUDA_SUCCESS: go ahead (op says what was reserved); CUDA_ERROR_OUT_OF_MEMORY: over the
 * container's limit, the driver is not called; CUDA_ERROR_NOT_PERMITTED: refused process. */
CUresult vgpu_mem_reserve(int ordinal, uint64_t bytes, struct vgpu_mem_op *op);

/* After the driver call: keeps the reservation under key on success, gives it back on
 * failure. */
void vgpu_mem_commit(const struct vgpu_mem_op *op, CUresult result, enum vgpu_alloc_kind kind, uint64_t key);

/* Adjusts a committed reservation to the size the driver really allocated (pitch).
 * Returns CUDA_ERROR_OUT_OF_MEMORY if the extra does not fit. */
CUresult vgpu_mem_grow(struct vgpu_mem_op *op, uint64_t actual);

/* A free of key, in two steps around the driver's call. Before it, the record is taken out
 * (1 if the key was accounted), so that the key the driver may hand out again at once, to
 * another thread's allocation, is recorded afresh; after it, the bytes are given back when
 * the driver freed and the record is put back when it did not. */
int vgpu_mem_free_begin(enum vgpu_alloc_kind kind, uint64_t key, struct vgpu_alloc *a);
void vgpu_mem_free_end(enum vgpu_alloc_kind kind, uint64_t key, const struct vgpu_alloc *a, CUresult result);

/* Gives bytes accounted on a config position back to the ledger (a free that took effect). */
void vgpu_mem_credit(int index, uint64_t bytes);

/* The driver took or gave back memory the library cannot size (a module's globals and code):
 * the next reservation or memory-info answer on the current context's GPU reads NVML's figure
 * for the container at once, not up to a second later. */
void vgpu_mem_reconcile_next(void);

/* Whether the process enforces (the hooks keep books only then). */
int vgpu_mem_enforcing(void);

/* Limit and container usage on an env index for the memory-info hooks: 0 if the index
 * is limited (then *limit and *used are set), -1 if not limited or not enforcing. */
int vgpu_mem_view(int index, uint64_t *limit, uint64_t *used);

/* What a memory-info hook reports: total = min(limit, device total), free = total - used,
 * never more than the device has free, never below zero. */
void vgpu_mem_clamp(uint64_t limit, uint64_t used, uint64_t *free, uint64_t *total);

#endif
