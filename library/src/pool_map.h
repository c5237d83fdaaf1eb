/* Where each memory pool of the process lives. The driver has no query for a pool's location,
 * so the library records it from the calls that hand pools out (cuMemPoolCreate's properties,
 * cuDeviceGetDefaultMemPool / cuDeviceGetMemPool / cuDeviceSetMemPool's device, CUDA 13's
 * cuMemGetDefaultMemPool / cuMemGetMemPool / cuMemSetMemPool's location) and forgets it
 * at cuMemPoolDestroy. A pool handed out by a route the library does not see has no record. */
#ifndef VGPU_POOL_MAP_H
#define VGPU_POOL_MAP_H

#include "cuda_api.h"

#define VGPU_POOL_HOST (-2) /* a pool of host memory (a host or host NUMA location): no GPU's */

/* Records (or replaces) the pool's place: a CUDA ordinal, or VGPU_POOL_HOST. 0, or -1 when
 * the table is full (the pool stays unknown). */
int vgpu_pool_put(CUmemoryPool pool, int place);

/* 1 and *place if the pool is recorded, 0 if not. */
int vgpu_pool_get(CUmemoryPool pool, int *place);

void vgpu_pool_forget(CUmemoryPool pool);

/* Forked child: the parent's pools are not the child's. */
void vgpu_pool_map_reset(void);

#endif
