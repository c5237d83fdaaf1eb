#include "glibc_compat.h"

#include <stdatomic.h>
#include <stddef.h>

#include "log.h"

typedef void *(*dlsym_fn)(void *, const char *);
static _Atomic(dlsym_fn) libc_dlsym;

/* The dlsym after ours: libc's (libdl's before glibc 2.34), or another interposer's that
 * comes after us. No dlopen here: this runs inside a sanitizer runtime's initialisation,
 * whose dlopen interceptor is not ready yet. */
VGPU_EARLY static dlsym_fn find_libc_dlsym(void)
{
	static const char *const versions[] = { "GLIBC_2.34", VGPU_GLIBC_BASE };
	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
		void *p = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
		if (p != NULL)
			return (dlsym_fn)p;
	}
	return NULL;
}

VGPU_EARLY void *vgpu_libc_dlsym_fn(void)
{
	dlsym_fn f = atomic_load_explicit(&libc_dlsym, memory_order_acquire);
	if (f == NULL) {
		f = find_libc_dlsym();
		if (f == NULL)
			return NULL;
		atomic_store_explicit(&libc_dlsym, f, memory_order_release);
	}
	return (void *)f;
}

VGPU_EARLY void *vgpu_libc_dlsym(void *handle, const char *name)
{
	dlsym_fn f = (dlsym_fn)vgpu_libc_dlsym_fn();
	if (f == NULL) {
		vgpu_log_error("cannot find libc's dlsym: symbol lookups fail");
		return NULL;
	}
	return f(handle, name);
}
