/* The table of hooked entry points and the real functions behind them. */
#ifndef VGPU_HOOK_TABLE_H
#define VGPU_HOOK_TABLE_H

#include <stdatomic.h>

#include "hook_list.h"

enum vgpu_lib { VGPU_LIB_CUDA, VGPU_LIB_NVML };

#define X_CUDA_ID(name, base, ver, ptds) HOOK_##name,
#define X_NVML_ID(name) HOOK_##name,
#define X_USED_ID(name) USED_##name,
enum vgpu_hook_id {
	VGPU_CUDA_HOOKS(X_CUDA_ID)
	VGPU_NVML_HOOKS(X_NVML_ID)
	VGPU_CUDA_USED(X_USED_ID)
	VGPU_NVML_USED(X_USED_ID)
	VGPU_HOOK_SLOTS
};
#define VGPU_HOOK_COUNT USED_cuCtxGetDevice /* slots below this are hooks */
#undef X_CUDA_ID
#undef X_NVML_ID
#undef X_USED_ID

struct vgpu_hook {
	const char *name;
	const char *base;    /* cuGetProcAddress base name; NULL for NVML and used-only slots */
	int min_version;
	int ptds;
	enum vgpu_lib lib;
	void *hook;          /* NULL for used-only slots */
};

extern const struct vgpu_hook vgpu_hooks[VGPU_HOOK_SLOTS];

/* Hook slot for an exported name, or -1. */
int vgpu_hook_find(const char *name);

/* 1 if p is one of the library's hook functions. */
int vgpu_is_hook(const void *p);

/* The driver library (dlopen'ed on first use, never at load time), or NULL. */
void *vgpu_driver_handle(enum vgpu_lib lib);

/* The real function behind a slot, looked up in the driver library (never through our own
 * dlsym, so never a hook), cached. NULL if the driver lacks it. */
void *vgpu_real(enum vgpu_hook_id id);

/* Records the driver's answer for a slot the driver does not export under its name
 * (cuGetProcAddress may hand out internal entry points). Ignored if p is a hook. */
void vgpu_real_offer(enum vgpu_hook_id id, void *p);

/* In a forked child nothing needs resetting: real pointers stay valid across fork. */

#define REAL(name) ((__typeof__(&name))vgpu_real(HOOK_##name))
#define USED(name) ((__typeof__(&name))vgpu_real(USED_##name))

#endif
