/* Stream-ordered allocations and memory pools. Each allocation is charged to the GPU the
 * driver takes it from, whatever context is current (or whether one is):
 *  - cuMemAllocAsync*: the current pool of the stream's device. The stream's device is asked of
 *    the driver: cuStreamGetCtx; the current context's device when that is the current
 *    context (the usual case: two cheap calls more than before), else cuCtxPushCurrent_v2 /
 *    cuCtxGetDevice / cuCtxPopCurrent_v2. NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are
 *    the current context's streams.
 *  - cuMemAllocFromPoolAsync*: the pool's location, which the driver cannot be asked for:
 *    recorded when the pool is handed out (pool_map.h): created, or a device's or a
 *    location's default or current pool (CUDA 13's cuMemGetDefaultMemPool and the like). A pool of host memory is charged
 *    nothing. A pool without a record is refused with CUDA_ERROR_NOT_SUPPORTED while a GPU
 *    has a memory limit (contract §9).
 * Counted when requested and given back when their free has run (hooks_mem.c, free_queue.h);
 * memory a pool keeps beyond that shows up through the NVML reconciliation. */
#include <stdatomic.h>

#include "hook_table.h"
#include "hooks.h"
#include "log.h"
#include "mem_account.h"
#include "pool_map.h"
#include "runtime.h"

#define REAL_OR_FAIL(var, name)                 \
	__typeof__(&name) var = REAL(name);     \
	if (var == NULL)                        \
		return CUDA_ERROR_NOT_FOUND

/* Whether the hooks keep books now (deciding the mode if it is not yet). */
static int accounting(void)
{
	int m = vgpu_runtime_mode();
	return m == VGPU_MODE_ENFORCE ? vgpu_runtime_map_cuda() == VGPU_MODE_ENFORCE : 0;
}

/* The CUDA ordinal of the stream's device into *ordinal; -1: the current context's. A stream
 * the driver cannot place is an error the allocation would meet too: returned as is. */
static CUresult stream_ordinal(CUstream stream, int *ordinal)
{
	*ordinal = -1;
	if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
		return CUDA_SUCCESS;
	__typeof__(&cuStreamGetCtx) get_ctx = USED(cuStreamGetCtx);
	__typeof__(&cuCtxGetCurrent) get_current = USED(cuCtxGetCurrent);
	__typeof__(&cuCtxGetDevice) get_device = USED(cuCtxGetDevice);
	if (get_ctx == NULL || get_current == NULL || get_device == NULL)
		return CUDA_SUCCESS; /* a driver without them has no stream-ordered allocator */
	CUcontext ctx = NULL, current = NULL;
	CUresult r = get_ctx(stream, &ctx);
	if (r != CUDA_SUCCESS)
		return r;
	if (get_current(&current) == CUDA_SUCCESS && current == ctx)
		return CUDA_SUCCESS;
	__typeof__(&cuCtxPushCurrent_v2) push = USED(cuCtxPushCurrent_v2);
	__typeof__(&cuCtxPopCurrent_v2) pop = USED(cuCtxPopCurrent_v2);
	if (push == NULL || pop == NULL)
		return CUDA_ERROR_NOT_SUPPORTED;
	if ((r = push(ctx)) != CUDA_SUCCESS)
		return r;
	CUdevice dev = -1;
	r = get_device(&dev);
	CUcontext popped = NULL;
	if (pop(&popped) != CUDA_SUCCESS || popped != ctx)
		vgpu_log_error("cannot restore the thread's context after looking up a stream's device");
	if (r == CUDA_SUCCESS)
		*ordinal = dev;
	return r;
}

#define ALLOC_ASYNC(name)                                                          \
	CUresult name(CUdeviceptr *dptr, size_t bytesize, CUstream stream)         \
	{                                                                          \
		REAL_OR_FAIL(real, name);                                          \
		int ordinal = -1;                                                  \
		CUresult r = accounting() ? stream_ordinal(stream, &ordinal) : CUDA_SUCCESS; \
		if (r != CUDA_SUCCESS)                                             \
			return r;                                                  \
		struct vgpu_mem_op op;                                             \
		if ((r = vgpu_mem_reserve(ordinal, bytesize, &op)) != CUDA_SUCCESS) \
			return r;                                                  \
		r = real(dptr, bytesize, stream);                                  \
		vgpu_mem_commit(&op, r, VGPU_ALLOC_PTR, r == CUDA_SUCCESS ? *dptr : 0); \
		return r;                                                          \
	}

ALLOC_ASYNC(cuMemAllocAsync)
ALLOC_ASYNC(cuMemAllocAsync_ptsz)

static int any_memory_limit(void)
{
	for (int i = 0; i < vgpu_rt.cfg.ndevices; i++)
		if (vgpu_rt.cfg.dev[i].mem_limit != 0)
			return 1;
	return 0;
}

/* Reserves bytes for an allocation from pool: op->index -1 when nothing is charged. */
static CUresult reserve_from_pool(CUmemoryPool pool, uint64_t bytes, struct vgpu_mem_op *op)
{
	static atomic_int said;
	int place;
	if (!accounting() || vgpu_pool_get(pool, &place) == 0) {
		if (accounting() && any_memory_limit()) {
			if (!atomic_exchange(&said, 1))
				vgpu_log_error("refused an allocation from a memory pool the library did not see created "
					       "or handed out (pool %p): its GPU is unknown, so is the limit it counts "
					       "against", (void *)pool);
			op->index = -1;
			return CUDA_ERROR_NOT_SUPPORTED;
		}
		return vgpu_mem_reserve(-1, bytes, op); /* passthrough or refused: says which */
	}
	if (place == VGPU_POOL_HOST) {
		op->index = -1;
		op->reserved = 0;
		return CUDA_SUCCESS;
	}
	return vgpu_mem_reserve(place, bytes, op);
}

#define ALLOC_FROM_POOL(name)                                                                       \
	CUresult name(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)       \
	{                                                                                           \
		REAL_OR_FAIL(real, name);                                                           \
		struct vgpu_mem_op op;                                                              \
		CUresult r = reserve_from_pool(pool, bytesize, &op);                                \
		if (r != CUDA_SUCCESS)                                                              \
			return r;                                                                   \
		r = real(dptr, bytesize, pool, stream);                                             \
		vgpu_mem_commit(&op, r, VGPU_ALLOC_PTR, r == CUDA_SUCCESS ? *dptr : 0);             \
		return r;                                                                           \
	}

ALLOC_FROM_POOL(cuMemAllocFromPoolAsync)
ALLOC_FROM_POOL(cuMemAllocFromPoolAsync_ptsz)

static void remember(CUmemoryPool pool, int place)
{
	if (vgpu_pool_put(pool, place) != 0)
		vgpu_log_error("too many memory pools to record: allocations from pool %p will be refused",
			       (void *)pool);
}

/* A pool of a location: a device's, or host memory's. A location type the library does not
 * know gets no record: its allocations are refused. */
static void remember_at(CUmemoryPool pool, int type, int id)
{
	if (type == CU_MEM_LOCATION_TYPE_DEVICE)
		remember(pool, id);
	else if (type == CU_MEM_LOCATION_TYPE_HOST || type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
		 type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
		remember(pool, VGPU_POOL_HOST);
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	REAL_OR_FAIL(real, cuMemPoolCreate);
	CUresult r = real(pool, props);
	if (r == CUDA_SUCCESS && pool != NULL && props != NULL)
		remember_at(*pool, props->location.type, props->location.id);
	return r;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	REAL_OR_FAIL(real, cuMemPoolDestroy);
	CUresult r = real(pool);
	if (r == CUDA_SUCCESS)
		vgpu_pool_forget(pool);
	return r;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
	REAL_OR_FAIL(real, cuDeviceGetDefaultMemPool);
	CUresult r = real(pool, dev);
	if (r == CUDA_SUCCESS && pool != NULL)
		remember(*pool, dev);
	return r;
}

/* A device's current pool is one of its own (cuDeviceSetMemPool takes only those). */
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
	REAL_OR_FAIL(real, cuDeviceGetMemPool);
	CUresult r = real(pool, dev);
	if (r == CUDA_SUCCESS && pool != NULL)
		remember(*pool, dev);
	return r;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
	REAL_OR_FAIL(real, cuDeviceSetMemPool);
	CUresult r = real(dev, pool);
	if (r == CUDA_SUCCESS)
		remember(pool, dev);
	return r;
}

/* CUDA 13's pools by location and allocation type (pinned or managed). */
CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type)
{
	REAL_OR_FAIL(real, cuMemGetDefaultMemPool);
	CUresult r = real(pool, location, type);
	if (r == CUDA_SUCCESS && pool != NULL && location != NULL)
		remember_at(*pool, location->type, location->id);
	return r;
}

CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type)
{
	REAL_OR_FAIL(real, cuMemGetMemPool);
	CUresult r = real(pool, location, type);
	if (r == CUDA_SUCCESS && pool != NULL && location != NULL)
		remember_at(*pool, location->type, location->id);
	return r;
}

/* The driver takes only a pool of that location. */
CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type, CUmemoryPool pool)
{
	REAL_OR_FAIL(real, cuMemSetMemPool);
	CUresult r = real(location, type, pool);
	if (r == CUDA_SUCCESS && location != NULL)
		remember_at(pool, location->type, location->id);
	return r;
}
