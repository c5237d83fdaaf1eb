#include "vmm_account.h"

#include "alloc_map.h"
#include "log.h"
#include "mem_account.h"
#include "spinlock.h"

static vgpu_spinlock lock = VGPU_SPINLOCK_INIT;

void vgpu_vmm_lock(void) { vgpu_spin_lock(&lock); }
void vgpu_vmm_unlock(void) { vgpu_spin_unlock(&lock); }
void vgpu_vmm_reset(void) { vgpu_spin_reset(&lock); }

/* Stores a handle's new counts, or gives its bytes back once nothing holds it. */
static void settle(uint64_t handle, const struct vgpu_alloc *a)
{
	if (a->refs > 0 || a->maps > 0) {
		if (vgpu_alloc_map_put(VGPU_ALLOC_VMM_HANDLE, handle, a) != 0)
			vgpu_log_error("out of memory recording a VMM handle");
		return;
	}
	struct vgpu_alloc gone;
	if (vgpu_alloc_map_take(VGPU_ALLOC_VMM_HANDLE, handle, &gone))
		vgpu_mem_credit(gone.dev, gone.bytes);
}

/* Every mapping is recorded, also of handles the hooks did not account (imported, or on a
 * GPU without a memory limit): an unmap walks the range mapping by mapping. */
void vgpu_vmm_mapped(uint64_t va, uint64_t size, uint64_t handle)
{
	struct vgpu_alloc m = { .bytes = size, .handle = handle };
	if (vgpu_alloc_map_put(VGPU_ALLOC_VMM_MAPPING, va, &m) != 0) {
		/* unrecorded, its handle's bytes stay charged: never given back early */
		vgpu_log_error("out of memory recording a VMM mapping: its handle stays counted until exit");
		return;
	}
	struct vgpu_alloc a;
	if (vgpu_alloc_map_get(VGPU_ALLOC_VMM_HANDLE, handle, &a)) {
		a.maps++;
		settle(handle, &a);
	}
}

/* The driver unmaps whole mappings only, so the range is mappings one after the other. */
void vgpu_vmm_unmapped(uint64_t va, uint64_t size)
{
	uint64_t end = va + size < va ? UINT64_MAX : va + size;
	for (uint64_t at = va; at < end;) {
		struct vgpu_alloc m, a;
		if (!vgpu_alloc_map_take(VGPU_ALLOC_VMM_MAPPING, at, &m) || m.bytes == 0)
			return; /* mapped before the hooks saw it */
		if (vgpu_alloc_map_get(VGPU_ALLOC_VMM_HANDLE, m.handle, &a) && a.maps > 0) {
			a.maps--;
			settle(m.handle, &a);
		}
		at = at + m.bytes < at ? end : at + m.bytes;
	}
}

void vgpu_vmm_released(uint64_t handle)
{
	struct vgpu_alloc a;
	if (!vgpu_alloc_map_get(VGPU_ALLOC_VMM_HANDLE, handle, &a))
		return; /* not ours: imported, or created before the hooks saw it */
	if (a.refs > 0)
		a.refs--;
	settle(handle, &a);
}

void vgpu_vmm_retained(uint64_t handle)
{
	struct vgpu_alloc a;
	if (vgpu_alloc_map_get(VGPU_ALLOC_VMM_HANDLE, handle, &a)) {
		a.refs++;
		settle(handle, &a);
	}
}
