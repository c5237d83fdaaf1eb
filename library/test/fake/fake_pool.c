/* TEST DOUBLE: memory pools and stream-ordered allocations, as the driver places them. A pool
 * lives on the device of its location (cuMemPoolCreate: a device location only here); every
 * device has a default pool (cuDeviceGetDefaultMemPool) and a current one (cuDeviceGetMemPool,
 * cuDeviceSetMemPool: a pool of that device; CUDA 13's cuMemGetDefaultMemPool, cuMemGetMemPool,
 * cuMemSetMemPool by a device location). cuMemAllocFromPoolAsync charges the pool's
 * device, cuMemAllocAsync the stream's device (its current pool), whatever context is current
 * or whether any is. The memory is charged from the call (no pool reserve is kept). */
#include <pthread.h>
#include <stdlib.h>

#include "fake_cuda.h"

struct fake_pool {
	int dev;        /* device index in the shared state */
	int is_default; /* a device's default pool: cannot be destroyed */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_pool default_pool[FAKE_MAX_DEV];
static struct fake_pool *current_pool[FAKE_MAX_DEV];

/* The current pool of a CUDA ordinal's device, or NULL. */
static struct fake_pool *device_pool(int ordinal, int want_default)
{
	int dev = fake_device_of(ordinal);
	if (dev < 0)
		return NULL;
	pthread_mutex_lock(&mu);
	default_pool[dev] = (struct fake_pool){ dev, 1 };
	if (current_pool[dev] == NULL)
		current_pool[dev] = &default_pool[dev];
	struct fake_pool *p = want_default ? &default_pool[dev] : current_pool[dev];
	pthread_mutex_unlock(&mu);
	return p;
}

static CUresult pool_create(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	if (pool == NULL || props == NULL || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = fake_device_of(props->location.id);
	if (dev < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	struct fake_pool *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	p->dev = dev;
	*pool = (CUmemoryPool)p;
	return CUDA_SUCCESS;
}

API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) { return pool_create(pool, props); }
/* A route libvgpu cannot hook: the same function under a name it does not know. */
API CUresult fake_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) { return pool_create(pool, props); }

API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	struct fake_pool *p = (struct fake_pool *)pool;
	if (p == NULL || p->is_default)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	if (current_pool[p->dev] == p)
		current_pool[p->dev] = &default_pool[p->dev]; /* as the driver: back to the default */
	pthread_mutex_unlock(&mu);
	free(p);
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice ordinal)
{
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	struct fake_pool *p = device_pool(ordinal, 1);
	if (p == NULL)
		return CUDA_ERROR_INVALID_DEVICE;
	*pool = (CUmemoryPool)p;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice ordinal)
{
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	struct fake_pool *p = device_pool(ordinal, 0);
	if (p == NULL)
		return CUDA_ERROR_INVALID_DEVICE;
	*pool = (CUmemoryPool)p;
	return CUDA_SUCCESS;
}

static CUresult set_pool(CUdevice ordinal, CUmemoryPool pool)
{
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	struct fake_pool *p = (struct fake_pool *)pool;
	int dev = fake_device_of(ordinal);
	if (dev < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (p == NULL || p->dev != dev)
		return CUDA_ERROR_INVALID_VALUE; /* the pool must be local to the device */
	device_pool(ordinal, 0);
	pthread_mutex_lock(&mu);
	current_pool[dev] = p;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

API CUresult cuDeviceSetMemPool(CUdevice ordinal, CUmemoryPool pool) { return set_pool(ordinal, pool); }
/* A route libvgpu cannot hook, as fake_cuMemPoolCreate. */
API CUresult fake_cuDeviceSetMemPool(CUdevice ordinal, CUmemoryPool pool) { return set_pool(ordinal, pool); }

/* CUDA 13's pools by location: device locations only here, one pool per device whatever the
 * allocation type. */
API CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type)
{
	(void)type;
	if (location == NULL || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	return cuDeviceGetDefaultMemPool(pool, location->id);
}

API CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type)
{
	(void)type;
	if (location == NULL || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	return cuDeviceGetMemPool(pool, location->id);
}

API CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type, CUmemoryPool pool)
{
	(void)type;
	if (location == NULL || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	return cuDeviceSetMemPool(location->id, pool);
}

static CUresult from_pool(CUdeviceptr *dptr, size_t bytesize, struct fake_pool *p)
{
	if (p == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t key;
	CUresult r = fake_alloc_on(p->dev, bytesize, &key, 0);
	if (r == CUDA_SUCCESS)
		*dptr = key;
	return r;
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	int ordinal = fake_stream_ordinal(stream);
	if (ordinal < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	return from_pool(dptr, bytesize, device_pool(ordinal, 0));
}

API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s) { return alloc_async(dptr, bytesize, s); }
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s) { return alloc_async(dptr, bytesize, s); }
/* Baseline for the benchmark: the same function under a name libvgpu does not hook. */
API CUresult fake_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s) { return alloc_async(dptr, bytesize, s); }

API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool p, CUstream s)
{
	(void)s;
	return from_pool(dptr, bytesize, (struct fake_pool *)p);
}
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool p, CUstream s)
{
	(void)s;
	return from_pool(dptr, bytesize, (struct fake_pool *)p);
}
