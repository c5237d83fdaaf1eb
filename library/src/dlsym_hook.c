/* The library's dlsym: the route by which a statically linked CUDA runtime (which
 * dlopen()s libcuda.so.1) and NVML users reach the driver.
 *
 *  - Only names shaped like cu[A-Z]... or nvml[A-Z]... are looked at; for a hooked name that
 *    the lookup would find, the hook is returned (for any handle, RTLD_NEXT and
 *    RTLD_DEFAULT included). A lookup that finds nothing still finds nothing.
 *  - Every other lookup is answered as glibc would answer the *caller*. For RTLD_NEXT that
 *    matters: glibc resolves "next" relative to the code that called dlsym, which would be
 *    libvgpu if we simply forwarded. Another preloaded interposer asking for the next
 *    "malloc" would then skip whatever sits between it and us, or get itself back and
 *    recurse. So RTLD_NEXT is resolved here, walking the link map after the caller's object.
 *  - Real functions are looked up through libc's dlsym (glibc_compat.h), never through this
 *    function, so the library cannot recurse into itself. */
#include "glibc_compat.h"

#include <link.h>
#include <stddef.h>
#include <string.h>
#include <sys/auxv.h>

#include "hook_table.h"

static int looks_like_driver_symbol(const char *n)
{
	if (n[0] == 'c' && n[1] == 'u' && n[2] >= 'A' && n[2] <= 'Z')
		return 1;
	return n[0] == 'n' && n[1] == 'v' && n[2] == 'm' && n[3] == 'l' && n[4] >= 'A' && n[4] <= 'Z';
}

static struct link_map *object_of(const void *addr)
{
	Dl_info info;
	struct link_map *map = NULL;
	if (dladdr1(addr, &info, (void **)&map, RTLD_DL_LINKMAP) == 0)
		return NULL;
	return map;
}

/* The vDSO sits in the link map but not in any search scope: glibc never answers a
 * lookup with it. */
static int is_vdso(const struct link_map *m)
{
	unsigned long base = getauxval(AT_SYSINFO_EHDR);
	return (base != 0 && m->l_addr == base) || strncmp(m->l_name, "linux-vdso", 10) == 0 ||
	       strncmp(m->l_name, "linux-gate", 10) == 0;
}

/* glibc's RTLD_NEXT for a given caller: the first definition in the objects loaded after
 * the caller's. Known difference: glibc searches only the global scope, so an object
 * dlopen()ed RTLD_LOCAL after the caller is skipped there and considered here -- it can
 * only matter for a name that no object of the global scope defines. */
static void *next_after(const void *caller, const char *name)
{
	struct link_map *self = object_of(caller);
	for (struct link_map *m = self ? self->l_next : NULL; m != NULL; m = m->l_next) {
		if (m->l_name == NULL || m->l_name[0] == '\0' || is_vdso(m))
			continue;
		/* A proper handle: objects loaded at start-up may lack a search list until
		 * dlopen()ed; RTLD_NOLOAD never loads anything. */
		void *h = dlopen(m->l_name, RTLD_LAZY | RTLD_NOLOAD);
		if (h == NULL)
			continue;
		void *p = vgpu_libc_dlsym(h, name);
		struct link_map *owner = p ? object_of(p) : NULL;
		if (dlclose(h) != 0) {
			/* the object stays loaded either way: it was loaded before we looked */
		}
		if (p != NULL && owner == m)
			return p;
	}
	/* Caller unknown (JIT code) or not found: glibc's own answer relative to us, which
	 * also sets dlerror() for a miss. */
	return vgpu_libc_dlsym(RTLD_NEXT, name);
}

/* dlfcn.h declares name nonnull; a caller passing NULL anyway must not crash in here. */
#pragma GCC diagnostic ignored "-Wnonnull-compare"
__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name)
{
	const void *caller = __builtin_return_address(0);
	if (name != NULL && looks_like_driver_symbol(name)) {
		int id = vgpu_hook_find(name);
		if (id >= 0) {
			void *found = handle == RTLD_NEXT ? next_after(caller, name) : vgpu_libc_dlsym(handle, name);
			return found != NULL ? vgpu_hooks[id].hook : NULL;
		}
	}
	if (handle == RTLD_NEXT)
		return next_after(caller, name);
	return vgpu_libc_dlsym(handle, name);
}
