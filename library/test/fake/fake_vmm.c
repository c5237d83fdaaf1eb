/* TEST DOUBLE: the driver's virtual memory management as the CUDA Programming Guide describes
 * it. cuMemCreate makes physical memory and a handle to it; cuMemAddressReserve a range of
 * addresses; cuMemMap puts the memory at an address; cuMemRelease drops the handle. The
 * physical memory is freed only when the last reference and the last mapping are both gone,
 * so the guide's pattern (create, reserve, map, release at once) holds memory that is mapped
 * but released. Reserved ranges are PROT_NONE host mappings: addresses no host allocation
 * (which the fake hands out as device pointers) can have. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "fake_cuda.h"

struct range { uint64_t va, size; };
struct mapping { uint64_t va, size, handle; };

static struct range ranges[4096];
static struct mapping maps[65536];
static size_t nranges, nmaps;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
			 unsigned long long flags)
{
	(void)flags;
	if (prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t key;
	int dev = fake_device_of(prop->location.id);
	if (dev < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	CUresult r = fake_alloc_on(dev, size, &key, 0);
	if (r == CUDA_SUCCESS)
		*handle = key;
	return r;
}

/* Under mu: frees a handle's memory once nothing holds it. */
static CUresult settle(struct fake_alloc *a)
{
	if (a->refs > 0 || a->maps > 0)
		return CUDA_SUCCESS;
	return fake_free_key(a->key);
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	pthread_mutex_lock(&mu);
	struct fake_alloc *a = fake_alloc_find(handle);
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	if (a != NULL && a->refs > 0) {
		a->refs--;
		r = settle(a);
	}
	pthread_mutex_unlock(&mu);
	return r;
}

API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
				 unsigned long long flags)
{
	(void)alignment; (void)addr; (void)flags;
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ptr == NULL || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
	if (nranges < sizeof(ranges) / sizeof(ranges[0])) {
		ranges[nranges++] = (struct range){ (uint64_t)(uintptr_t)p, size };
		*ptr = (uint64_t)(uintptr_t)p;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&mu);
	if (r != CUDA_SUCCESS)
		munmap(p, size);
	return r;
}

API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	pthread_mutex_lock(&mu);
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < nranges; i++) {
		if (ranges[i].va == ptr && ranges[i].size == size) {
			ranges[i] = ranges[--nranges];
			r = CUDA_SUCCESS;
			break;
		}
	}
	for (size_t i = 0; r == CUDA_SUCCESS && i < nmaps; i++)
		if (maps[i].va >= ptr && maps[i].va < ptr + size)
			r = CUDA_ERROR_INVALID_VALUE; /* still mapped: unmap first */
	pthread_mutex_unlock(&mu);
	if (r == CUDA_SUCCESS)
		munmap((void *)(uintptr_t)ptr, size);
	return r;
}

static int reserved(uint64_t va, uint64_t size)
{
	for (size_t i = 0; i < nranges; i++)
		if (va >= ranges[i].va && va + size <= ranges[i].va + ranges[i].size)
			return 1;
	return 0;
}

static long mapping_at(uint64_t va)
{
	for (size_t i = 0; i < nmaps; i++)
		if (va >= maps[i].va && va < maps[i].va + maps[i].size)
			return (long)i;
	return -1;
}

API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
		      unsigned long long flags)
{
	(void)flags;
	pthread_mutex_lock(&mu);
	struct fake_alloc *a = fake_alloc_find(handle);
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	if (a != NULL && a->refs > 0 && size > 0 && offset + size <= a->bytes && reserved(ptr, size) &&
	    mapping_at(ptr) < 0 && mapping_at(ptr + size - 1) < 0 && nmaps < sizeof(maps) / sizeof(maps[0])) {
		maps[nmaps++] = (struct mapping){ ptr, size, handle };
		a->maps++;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

/* The range must be whole mappings, one after the other, as the driver requires. */
API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	pthread_mutex_lock(&mu);
	CUresult r = CUDA_SUCCESS;
	for (uint64_t at = ptr; at < ptr + size;) {
		long i = mapping_at(at);
		if (i < 0 || maps[i].va != at || at + maps[i].size > ptr + size) {
			r = CUDA_ERROR_INVALID_VALUE;
			break;
		}
		at += maps[i].size;
	}
	for (uint64_t at = ptr; r == CUDA_SUCCESS && at < ptr + size;) {
		long i = mapping_at(at);
		struct mapping m = maps[i];
		maps[i] = maps[--nmaps];
		at += m.size;
		struct fake_alloc *a = fake_alloc_find(m.handle);
		if (a != NULL) {
			a->maps--;
			r = settle(a);
		}
	}
	pthread_mutex_unlock(&mu);
	return size == 0 ? CUDA_ERROR_INVALID_VALUE : r;
}

API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	pthread_mutex_lock(&mu);
	long i = mapping_at((uint64_t)(uintptr_t)addr);
	struct fake_alloc *a = i >= 0 ? fake_alloc_find(maps[i].handle) : NULL;
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	if (a != NULL) {
		a->refs++;
		*handle = a->key;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

/* Baselines for the benchmark: the same functions under names libvgpu does not hook. */
API CUresult fake_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
			      unsigned long long flags)
{
	return cuMemCreate(handle, size, prop, flags);
}
API CUresult fake_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			   unsigned long long flags)
{
	return cuMemMap(ptr, size, offset, handle, flags);
}
API CUresult fake_cuMemUnmap(CUdeviceptr ptr, size_t size) { return cuMemUnmap(ptr, size); }
API CUresult fake_cuMemRelease(CUmemGenericAllocationHandle handle) { return cuMemRelease(handle); }
