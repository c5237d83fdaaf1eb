/* cuCtxSetLimit (cudaDeviceSetLimit): the device-side malloc heap and the per-thread stack
 * are device memory the driver sets aside for the context when the limit is set.
 *
 *  - CU_LIMIT_MALLOC_HEAP_SIZE is charged its value.
 *  - CU_LIMIT_STACK_SIZE is per thread; the driver backs it for every thread the device can
 *    hold resident, so it is charged value x SM count x maximum threads per SM (from
 *    cuDeviceGetAttribute; STACK_THREADS_FALLBACK, more than any GPU holds, when the driver
 *    does not answer).
 *
 * The charge is per context and limit: raising the limit reserves the difference first
 * (refused with CUDA_ERROR_OUT_OF_MEMORY past the memory limit; the driver is not called),
 * lowering it gives the difference back once the driver has taken the new value. The
 * context's default heap and stack (8 MiB, 1 KiB a thread) are part of the context, which
 * only NVML sees; the first setting is charged in full on top of it. */
#include <stdint.h>

#include "alloc_map.h"
#include "hook_table.h"
#include "hooks.h"
#include "log.h"
#include "mem_account.h"

#define STACK_THREADS_FALLBACK (256ull * 2048ull)

static uint64_t resident_threads(void)
{
	__typeof__(&cuCtxGetDevice) get_dev = USED(cuCtxGetDevice);
	__typeof__(&cuDeviceGetAttribute) attr = USED(cuDeviceGetAttribute);
	CUdevice dev;
	int sms = 0, per_sm = 0;
	if (get_dev == NULL || attr == NULL || get_dev(&dev) != CUDA_SUCCESS ||
	    attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
	    attr(&per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) != CUDA_SUCCESS || sms <= 0 ||
	    per_sm <= 0)
		return STACK_THREADS_FALLBACK;
	return (uint64_t)sms * (uint64_t)per_sm;
}

static uint64_t limit_charge(CUlimit limit, size_t value)
{
	if (limit == CU_LIMIT_MALLOC_HEAP_SIZE)
		return value;
	uint64_t threads = resident_threads();
	return value > UINT64_MAX / threads ? UINT64_MAX : (uint64_t)value * threads;
}

static void keep(uint64_t key, uint64_t bytes, int index)
{
	struct vgpu_alloc a = { .bytes = bytes, .dev = index };
	if (vgpu_alloc_map_put(VGPU_ALLOC_CTX_LIMIT, key, &a) != 0)
		vgpu_log_error("out of memory recording a context limit: its %llu bytes stay counted until exit",
			       (unsigned long long)bytes);
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
	__typeof__(&cuCtxSetLimit) real = REAL(cuCtxSetLimit);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	__typeof__(&cuCtxGetCurrent) get_ctx = USED(cuCtxGetCurrent);
	CUcontext ctx = NULL;
	if ((limit != CU_LIMIT_MALLOC_HEAP_SIZE && limit != CU_LIMIT_STACK_SIZE) || get_ctx == NULL ||
	    get_ctx(&ctx) != CUDA_SUCCESS || ctx == NULL)
		return real(limit, value); /* no memory, or no context: the driver answers */
	uint64_t key = (uint64_t)(uintptr_t)ctx << 1 | (limit == CU_LIMIT_MALLOC_HEAP_SIZE);
	uint64_t want = limit_charge(limit, value);
	struct vgpu_alloc old;
	int had = vgpu_mem_free_begin(VGPU_ALLOC_CTX_LIMIT, key, &old);
	uint64_t held = had ? old.bytes : 0;
	CUresult r;
	if (want > held) {
		struct vgpu_mem_op op;
		r = vgpu_mem_reserve(-1, want - held, &op);
		if (r == CUDA_SUCCESS)
			r = real(limit, value);
		if (r != CUDA_SUCCESS) {
			vgpu_mem_commit(&op, r, VGPU_ALLOC_CTX_LIMIT, key); /* gives the difference back */
			if (had)
				keep(key, held, old.dev);
			return r;
		}
		if (op.index >= 0)
			keep(key, held + op.reserved, op.index);
		else if (had)
			keep(key, held, old.dev);
		return r;
	}
	r = real(limit, value);
	if (!had)
		return r;
	if (r != CUDA_SUCCESS) {
		keep(key, held, old.dev);
		return r;
	}
	vgpu_mem_credit(old.dev, held - want);
	if (want > 0)
		keep(key, want, old.dev);
	return r;
}
