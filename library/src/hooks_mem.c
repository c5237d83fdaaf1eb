/* Allocation, free and memory-info hooks of the CUDA driver API (the virtual memory API's:
 * hooks_vmm.c; stream-ordered allocations and pools: hooks_pool.c). */
#include <limits.h>

#include "hook_table.h"
#include "free_queue.h"
#include "hooks.h"
#include "mem_account.h"
#include "runtime.h"

#define REAL_OR_FAIL(var, name)                 \
	__typeof__(&name) var = REAL(name);     \
	if (var == NULL)                        \
		return CUDA_ERROR_NOT_FOUND

/* Pitch alignment is device-dependent and at most 512 bytes on every documented GPU:
 * reserve the upper bound, then settle on the pitch the driver chose. */
#define PITCH_ALIGN_MAX 512u

static uint64_t pitch_bound(uint64_t width, uint64_t height)
{
	return ((width + PITCH_ALIGN_MAX - 1) / PITCH_ALIGN_MAX) * PITCH_ALIGN_MAX * height;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	REAL_OR_FAIL(real, cuMemAlloc_v2);
	struct vgpu_mem_op op;
	CUresult r = vgpu_mem_reserve(-1, bytesize, &op);
	if (r != CUDA_SUCCESS)
		return r;
	r = real(dptr, bytesize);
	vgpu_mem_commit(&op, r, VGPU_ALLOC_PTR, r == CUDA_SUCCESS ? *dptr : 0);
	return r;
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
	REAL_OR_FAIL(real, cuMemAlloc);
	struct vgpu_mem_op op;
	CUresult r = vgpu_mem_reserve(-1, bytesize, &op);
	if (r != CUDA_SUCCESS)
		return r;
	r = real(dptr, bytesize);
	vgpu_mem_commit(&op, r, VGPU_ALLOC_PTR, r == CUDA_SUCCESS ? *dptr : 0);
	return r;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	/* Managed memory can be oversubscribed by the driver; it is counted in full so that
	 * it cannot be used to escape the limit. */
	REAL_OR_FAIL(real, cuMemAllocManaged);
	struct vgpu_mem_op op;
	CUresult r = vgpu_mem_reserve(-1, bytesize, &op);
	if (r != CUDA_SUCCESS)
		return r;
	r = real(dptr, bytesize, flags);
	vgpu_mem_commit(&op, r, VGPU_ALLOC_PTR, r == CUDA_SUCCESS ? *dptr : 0);
	return r;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elementSize)
{
	REAL_OR_FAIL(real, cuMemAllocPitch_v2);
	struct vgpu_mem_op op;
	CUresult r = vgpu_mem_reserve(-1, pitch_bound(width, height), &op);
	if (r != CUDA_SUCCESS)
		return r;
	r = real(dptr, pitch, width, height, elementSize);
	if (r == CUDA_SUCCESS && op.index >= 0) {
		uint64_t actual = (uint64_t)*pitch * height;
		if (actual > op.reserved && vgpu_mem_grow(&op, actual) != CUDA_SUCCESS) {
			__typeof__(&cuMemFree_v2) rfree = REAL(cuMemFree_v2);
			if (rfree != NULL && rfree(*dptr) == CUDA_SUCCESS)
				r = CUDA_ERROR_OUT_OF_MEMORY; /* the grown size is over the limit */
		}
	}
	vgpu_mem_commit(&op, r, VGPU_ALLOC_PTR, r == CUDA_SUCCESS ? *dptr : 0);
	return r;
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
			 unsigned int elementSize)
{
	REAL_OR_FAIL(real, cuMemAllocPitch);
	struct vgpu_mem_op op;
	CUresult r = vgpu_mem_reserve(-1, pitch_bound(width, height), &op);
	if (r != CUDA_SUCCESS)
		return r;
	r = real(dptr, pitch, width, height, elementSize);
	if (r == CUDA_SUCCESS && op.index >= 0) {
		uint64_t actual = (uint64_t)*pitch * height;
		if (actual > op.reserved && vgpu_mem_grow(&op, actual) != CUDA_SUCCESS) {
			__typeof__(&cuMemFree) rfree = REAL(cuMemFree);
			if (rfree != NULL && rfree(*dptr) == CUDA_SUCCESS)
				r = CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	vgpu_mem_commit(&op, r, VGPU_ALLOC_PTR, r == CUDA_SUCCESS ? *dptr : 0);
	return r;
}

/* Freed when the call returns: the bytes come back at once. */
#define FREE_HOOK(name, ptr_type)                                               \
	CUresult name(ptr_type dptr)                                            \
	{                                                                       \
		REAL_OR_FAIL(real, name);                                       \
		struct vgpu_alloc a;                                            \
		int ours = vgpu_mem_free_begin(VGPU_ALLOC_PTR, dptr, &a);       \
		CUresult r = real(dptr);                                        \
		if (ours)                                                       \
			vgpu_mem_free_end(VGPU_ALLOC_PTR, dptr, &a, r);         \
		return r;                                                       \
	}

FREE_HOOK(cuMemFree_v2, CUdeviceptr)
FREE_HOOK(cuMemFree, CUdeviceptr_v1)

/* Queued on the stream: the bytes come back once the stream has run the free (free_queue.h).
 * NULL is the per-thread default stream for the _ptsz entry point, the legacy one otherwise. */
#define FREE_ASYNC_HOOK(name, null_stream)                                                   \
	CUresult name(CUdeviceptr dptr, CUstream stream)                                     \
	{                                                                                    \
		REAL_OR_FAIL(real, name);                                                    \
		struct vgpu_alloc a;                                                         \
		int ours = vgpu_mem_free_begin(VGPU_ALLOC_PTR, dptr, &a);                    \
		CUresult r = real(dptr, stream);                                             \
		if (ours && r != CUDA_SUCCESS)                                               \
			vgpu_mem_free_end(VGPU_ALLOC_PTR, dptr, &a, r);                      \
		else if (ours)                                                               \
			vgpu_free_queue_add(stream == NULL ? (null_stream) : stream, a.dev, a.bytes); \
		return r;                                                                    \
	}

FREE_ASYNC_HOOK(cuMemFreeAsync, NULL)
FREE_ASYNC_HOOK(cuMemFreeAsync_ptsz, CU_STREAM_PER_THREAD)

/* --- memory info: the container sees its limit as the device's size --------------------- */

static int info_refused(void)
{
	int m = vgpu_runtime_mode();
	if (m == VGPU_MODE_ENFORCE)
		m = vgpu_runtime_map_cuda();
	if (m == VGPU_MODE_REFUSED) {
		vgpu_runtime_report_refusal();
		return 1;
	}
	return 0;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
	REAL_OR_FAIL(real, cuMemGetInfo_v2);
	if (info_refused())
		return CUDA_ERROR_NOT_PERMITTED;
	CUresult r = real(free, total);
	uint64_t limit, used;
	if (r != CUDA_SUCCESS || free == NULL || total == NULL ||
	    vgpu_mem_view(vgpu_runtime_current_index(), &limit, &used) != 0)
		return r;
	uint64_t f = *free, t = *total;
	vgpu_mem_clamp(limit, used, &f, &t);
	*free = (size_t)f;
	*total = (size_t)t;
	return r;
}

CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
	REAL_OR_FAIL(real, cuMemGetInfo);
	if (info_refused())
		return CUDA_ERROR_NOT_PERMITTED;
	CUresult r = real(free, total);
	uint64_t limit, used;
	if (r != CUDA_SUCCESS || free == NULL || total == NULL ||
	    vgpu_mem_view(vgpu_runtime_current_index(), &limit, &used) != 0)
		return r;
	uint64_t f = *free, t = *total;
	vgpu_mem_clamp(limit, used, &f, &t);
	*free = (unsigned int)(f > UINT_MAX ? UINT_MAX : f);
	*total = (unsigned int)(t > UINT_MAX ? UINT_MAX : t);
	return r;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	REAL_OR_FAIL(real, cuDeviceTotalMem_v2);
	if (info_refused())
		return CUDA_ERROR_NOT_PERMITTED;
	CUresult r = real(bytes, dev);
	int index = vgpu_runtime_index_of_ordinal(dev);
	if (r == CUDA_SUCCESS && bytes != NULL && index >= 0 && vgpu_rt.cfg.dev[index].mem_limit != 0 &&
	    vgpu_rt.cfg.dev[index].mem_limit < *bytes)
		*bytes = (size_t)vgpu_rt.cfg.dev[index].mem_limit;
	return r;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
	REAL_OR_FAIL(real, cuDeviceTotalMem);
	if (info_refused())
		return CUDA_ERROR_NOT_PERMITTED;
	CUresult r = real(bytes, dev);
	int index = vgpu_runtime_index_of_ordinal(dev);
	if (r == CUDA_SUCCESS && bytes != NULL && index >= 0 && vgpu_rt.cfg.dev[index].mem_limit != 0 &&
	    vgpu_rt.cfg.dev[index].mem_limit < *bytes)
		*bytes = (unsigned int)vgpu_rt.cfg.dev[index].mem_limit;
	return r;
}
