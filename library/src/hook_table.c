#include "glibc_compat.h"

#include "hook_table.h"

#include <stdint.h>
#include <string.h>

#include "hooks.h"
#include "log.h"
#include "spinlock.h"

#define X_CUDA_ROW(n, b, v, p) { #n, #b, v, p, VGPU_LIB_CUDA, (void *)n },
#define X_NVML_ROW(n) { #n, NULL, 0, 0, VGPU_LIB_NVML, (void *)n },
#define X_CUDA_USED_ROW(n) { #n, NULL, 0, 0, VGPU_LIB_CUDA, NULL },
#define X_NVML_USED_ROW(n) { #n, NULL, 0, 0, VGPU_LIB_NVML, NULL },
const struct vgpu_hook vgpu_hooks[VGPU_HOOK_SLOTS] = {
	VGPU_CUDA_HOOKS(X_CUDA_ROW)
	VGPU_NVML_HOOKS(X_NVML_ROW)
	VGPU_CUDA_USED(X_CUDA_USED_ROW)
	VGPU_NVML_USED(X_NVML_USED_ROW)
};

static _Atomic(void *) real_fn[VGPU_HOOK_SLOTS];
static char missing_marker;
#define MISSING ((void *)&missing_marker) /* looked up, not in the driver */
static _Atomic(void *) driver[2];
static vgpu_spinlock driver_lock = VGPU_SPINLOCK_INIT;

VGPU_EARLY int vgpu_hook_find(const char *name)
{
	for (int i = 0; i < VGPU_HOOK_COUNT; i++)
		if (strcmp(vgpu_hooks[i].name, name) == 0)
			return i;
	return -1;
}

int vgpu_is_hook(const void *p)
{
	for (int i = 0; i < VGPU_HOOK_COUNT; i++)
		if (vgpu_hooks[i].hook == p)
			return 1;
	return 0;
}

void *vgpu_driver_handle(enum vgpu_lib lib)
{
	void *h = atomic_load_explicit(&driver[lib], memory_order_acquire);
	if (h != NULL)
		return h;
	static const char *const sonames[] = { "libcuda.so.1", "libnvidia-ml.so.1" };
	vgpu_spin_lock(&driver_lock);
	h = atomic_load(&driver[lib]);
	if (h == NULL) {
		/* Already loaded by the application in the usual case; RTLD_NOLOAD first so
		 * that the library never loads the driver into a process on its own when a
		 * plain lookup will do. */
		h = dlopen(sonames[lib], RTLD_LAZY | RTLD_NOLOAD);
		if (h == NULL)
			h = dlopen(sonames[lib], RTLD_LAZY);
		if (h == NULL) {
			const char *e = dlerror();
			vgpu_log_error("cannot load %s: %s", sonames[lib], e ? e : "unknown error");
		}
		atomic_store_explicit(&driver[lib], h, memory_order_release);
	}
	vgpu_spin_unlock(&driver_lock);
	return h;
}

void *vgpu_real(enum vgpu_hook_id id)
{
	void *p = atomic_load_explicit(&real_fn[id], memory_order_acquire);
	if (p != NULL)
		return p == MISSING ? NULL : p;
	void *h = vgpu_driver_handle(vgpu_hooks[id].lib);
	if (h == NULL)
		return NULL; /* not cached: the driver may be loadable later */
	p = vgpu_libc_dlsym(h, vgpu_hooks[id].name);
	if (p == NULL || vgpu_is_hook(p))
		p = MISSING; /* a handle lookup never yields our export; guard anyway: no recursion */
	void *expected = NULL;
	if (!atomic_compare_exchange_strong(&real_fn[id], &expected, p))
		p = expected;
	return p == MISSING ? NULL : p;
}

void vgpu_real_offer(enum vgpu_hook_id id, void *p)
{
	if (p == NULL || vgpu_is_hook(p))
		return;
	if (vgpu_real(id) != NULL)
		return; /* the driver's export wins */
	void *expected = MISSING;
	if (!atomic_compare_exchange_strong(&real_fn[id], &expected, p)) {
		expected = NULL;
		atomic_compare_exchange_strong(&real_fn[id], &expected, p);
	}
}
