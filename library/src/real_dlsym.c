#include "glibc_compat.h"

#include <stdatomic.h>
#include <stddef.h>

#include "log.h"

typedef void *(*dlsym_fn)(void *, const char *);
static _Atomic(dlsym_fn) libc_dlsym;

static dlsym_fn find_libc_dlsym(void)
{
	static const struct { const char *lib, *version; } where[] = {
		{ "libc.so.6", "GLIBC_2.34" },         /* glibc >= 2.34 */
		{ "libdl.so.2", VGPU_GLIBC_BASE },     /* before: libdl, NEEDED by libvgpu */
		{ "libc.so.6", VGPU_GLIBC_BASE },
	};
	for (size_t i = 0; i < sizeof(where) / sizeof(where[0]); i++) {
		void *h = dlopen(where[i].lib, RTLD_LAZY | RTLD_NOLOAD);
		if (h == NULL)
			continue;
		void *p = dlvsym(h, "dlsym", where[i].version);
		if (dlclose(h) != 0) {
			/* still loaded: it was loaded before we looked */
		}
		if (p != NULL)
			return (dlsym_fn)p;
	}
	return NULL;
}

void *vgpu_libc_dlsym(void *handle, const char *name)
{
	dlsym_fn f = atomic_load_explicit(&libc_dlsym, memory_order_acquire);
	if (f == NULL) {
		f = find_libc_dlsym();
		if (f == NULL) {
			vgpu_log_error("cannot find libc's dlsym: symbol lookups fail");
			return NULL;
		}
		atomic_store_explicit(&libc_dlsym, f, memory_order_release);
	}
	return f(handle, name);
}
