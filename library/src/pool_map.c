#include "pool_map.h"

#include <string.h>

#include "spinlock.h"

/* A process has a default and a current pool per device and the pools it creates: few. */
#define POOL_SLOTS 1024

static struct { CUmemoryPool pool; int place; } slots[POOL_SLOTS];
static int nslots;
static vgpu_spinlock lock = VGPU_SPINLOCK_INIT;

static int find(CUmemoryPool pool)
{
	for (int i = 0; i < nslots; i++)
		if (slots[i].pool == pool)
			return i;
	return -1;
}

int vgpu_pool_put(CUmemoryPool pool, int place)
{
	if (pool == NULL)
		return 0;
	int r = 0;
	vgpu_spin_lock(&lock);
	int i = find(pool);
	if (i < 0 && nslots < POOL_SLOTS)
		i = nslots++;
	if (i >= 0)
		slots[i].pool = pool, slots[i].place = place;
	else
		r = -1;
	vgpu_spin_unlock(&lock);
	return r;
}

int vgpu_pool_get(CUmemoryPool pool, int *place)
{
	vgpu_spin_lock(&lock);
	int i = pool == NULL ? -1 : find(pool);
	if (i >= 0)
		*place = slots[i].place;
	vgpu_spin_unlock(&lock);
	return i >= 0;
}

void vgpu_pool_forget(CUmemoryPool pool)
{
	vgpu_spin_lock(&lock);
	int i = pool == NULL ? -1 : find(pool);
	if (i >= 0)
		slots[i] = slots[--nslots];
	vgpu_spin_unlock(&lock);
}

void vgpu_pool_map_reset(void)
{
	memset(slots, 0, sizeof(slots));
	nslots = 0;
	vgpu_spin_reset(&lock);
}
