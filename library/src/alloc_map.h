/* In-process record of what the hooks accounted, so that a free knows what to give back:
 * device pointers, CUDA arrays, VMM allocation handles and a context's heap and stack (bytes
 * and device index), and VMM mappings (address -> the handle mapped there and the mapping's
 * size). */
#ifndef VGPU_ALLOC_MAP_H
#define VGPU_ALLOC_MAP_H

#include <stdint.h>

enum vgpu_alloc_kind {
	VGPU_ALLOC_PTR = 0,
	VGPU_ALLOC_VMM_HANDLE = 1,
	VGPU_ALLOC_VMM_MAPPING = 2,
	VGPU_ALLOC_ARRAY = 3,     /* CUDA arrays and mipmapped arrays, by handle */
	VGPU_ALLOC_CTX_LIMIT = 4, /* a context's device heap or stack (cuCtxSetLimit) */
};

struct vgpu_alloc {
	uint64_t bytes;  /* PTR, ARRAY, CTX_LIMIT, VMM_HANDLE: bytes accounted; VMM_MAPPING: the mapping's size */
	uint64_t handle; /* VMM_MAPPING: the allocation handle mapped there */
	int32_t dev;     /* PTR, ARRAY, CTX_LIMIT, VMM_HANDLE: the config position the bytes are accounted on */
	uint32_t refs;   /* VMM_HANDLE: the application's references (cuMemCreate, cuMemRetainAllocationHandle) */
	uint32_t maps;   /* VMM_HANDLE: its mappings (cuMemMap) */
	uint32_t pad;
};

/* Adds or replaces the entry. -1 when out of memory. */
int vgpu_alloc_map_put(enum vgpu_alloc_kind kind, uint64_t key, const struct vgpu_alloc *a);
/* Removes the entry; returns 1 and its value if present, 0 if not. */
int vgpu_alloc_map_take(enum vgpu_alloc_kind kind, uint64_t key, struct vgpu_alloc *out);
/* Looks the entry up without removing it. */
int vgpu_alloc_map_get(enum vgpu_alloc_kind kind, uint64_t key, struct vgpu_alloc *out);
/* Forked child: the parent's allocations are not the child's. */
void vgpu_alloc_map_reset(void);

#endif
