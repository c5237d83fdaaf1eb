/* Accounting of the virtual memory API (hooks_vmm.c). The driver frees a handle's physical
 * memory only when the application holds no reference to it (cuMemCreate and
 * cuMemRetainAllocationHandle take one, each cuMemRelease drops one) and it is mapped nowhere
 * (cuMemMap adds a mapping, cuMemUnmap removes the mappings of a range). The bytes stay
 * charged until both counts are zero: the CUDA Programming Guide releases a handle right
 * after mapping it, and its memory lives on until the unmap.
 *
 * The hooks hold vgpu_vmm_lock across the driver call and the bookkeeping, so the counts
 * change in the order the driver's do, whatever the application's threads race. */
#ifndef VGPU_VMM_ACCOUNT_H
#define VGPU_VMM_ACCOUNT_H

#include <stdint.h>

void vgpu_vmm_lock(void);
void vgpu_vmm_unlock(void);
/* Forked child: the lock may have been held by a thread that does not exist there. */
void vgpu_vmm_reset(void);

/* After the driver call succeeded, under the lock. */
void vgpu_vmm_mapped(uint64_t va, uint64_t size, uint64_t handle);
void vgpu_vmm_unmapped(uint64_t va, uint64_t size);
void vgpu_vmm_released(uint64_t handle);
void vgpu_vmm_retained(uint64_t handle);

#endif
