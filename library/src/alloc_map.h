/* In-process record of the allocations the hooks accounted: key (device pointer or VMM
 * handle) -> bytes and device index, so a free knows what to give back. */
#ifndef VGPU_ALLOC_MAP_H
#define VGPU_ALLOC_MAP_H

#include <stdint.h>

enum vgpu_alloc_kind { VGPU_ALLOC_PTR = 0, VGPU_ALLOC_VMM_HANDLE = 1 };

int vgpu_alloc_map_put(enum vgpu_alloc_kind kind, uint64_t key, uint64_t bytes, int dev);
/* Removes the entry; returns 1 and its bytes/dev if present, 0 if not. */
int vgpu_alloc_map_take(enum vgpu_alloc_kind kind, uint64_t key, uint64_t *bytes, int *dev);
/* Looks the entry up without removing it. */
int vgpu_alloc_map_get(enum vgpu_alloc_kind kind, uint64_t key, uint64_t *bytes, int *dev);
/* Forked child: the parent's allocations are not the child's. */
void vgpu_alloc_map_reset(void);

#endif
