#include "glibc_compat.h"

#include <elf.h>
#include <link.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
static _Atomic(dlsym_fn) libc_dlsym;
static _Atomic(dlvsym_fn) libc_dlvsym;

VGPU_EARLY static int same(const char *a, const char *b)
{
	while (*a != '\0' && *a == *b)
		a++, b++;
	return *a == *b;
}

VGPU_EARLY static uint32_t gnu_hash(const char *s)
{
	uint32_t h = 5381;
	for (; *s != '\0'; s++)
		h = h * 33 + (unsigned char)*s;
	return h;
}

/* A dynamic-section address: relocated in place by the loader on most targets, not on all. */
VGPU_EARLY static uintptr_t dyn_addr(const struct link_map *m, uintptr_t p)
{
	return p < m->l_addr ? p + m->l_addr : p;
}

VGPU_EARLY static int defines(const ElfW(Sym) *s, const char *strtab, const char *name)
{
	return s->st_shndx != SHN_UNDEF && s->st_value != 0 && ELF64_ST_TYPE(s->st_info) == STT_FUNC &&
	       same(strtab + s->st_name, name);
}

/* The function `name` as one loaded object defines it (any version), read from its dynamic
 * symbol table through its GNU hash table, or its SysV one. */
VGPU_EARLY static void *object_symbol(const struct link_map *m, const char *name)
{
	const ElfW(Sym) *symtab = NULL;
	const char *strtab = NULL;
	const uint32_t *gh = NULL, *sysv = NULL;
	for (const ElfW(Dyn) *d = m->l_ld; d != NULL && d->d_tag != DT_NULL; d++) {
		if (d->d_tag == DT_SYMTAB)
			symtab = (const ElfW(Sym) *)dyn_addr(m, d->d_un.d_ptr);
		else if (d->d_tag == DT_STRTAB)
			strtab = (const char *)dyn_addr(m, d->d_un.d_ptr);
		else if (d->d_tag == DT_GNU_HASH)
			gh = (const uint32_t *)dyn_addr(m, d->d_un.d_ptr);
		else if (d->d_tag == DT_HASH)
			sysv = (const uint32_t *)dyn_addr(m, d->d_un.d_ptr);
	}
	if (symtab == NULL || strtab == NULL)
		return NULL;
	if (gh != NULL && gh[0] != 0) {
		uint32_t nbuckets = gh[0], symoffset = gh[1], bloom_words = gh[2];
		const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(gh + 4) + bloom_words);
		const uint32_t *chain = buckets + nbuckets;
		uint32_t h = gnu_hash(name);
		for (uint32_t i = buckets[h % nbuckets]; i != 0 && i >= symoffset; i++) {
			uint32_t h2 = chain[i - symoffset];
			if ((h | 1) == (h2 | 1) && defines(&symtab[i], strtab, name))
				return (void *)(m->l_addr + symtab[i].st_value);
			if (h2 & 1)
				break;
		}
		return NULL;
	}
	if (sysv != NULL)
		for (uint32_t i = 0; i < sysv[1]; i++)
			if (defines(&symtab[i], strtab, name))
				return (void *)(m->l_addr + symtab[i].st_value);
	return NULL;
}

/* libc's dlvsym (libdl's before glibc 2.34), or another interposer's that comes after us:
 * the first definition in the objects loaded after libvgpu. Read from the ELF tables, not
 * looked up: the library exports a dlvsym of its own, which every dlvsym reference --
 * its own too -- binds to. */
VGPU_EARLY static dlvsym_fn find_libc_dlvsym(void)
{
	Dl_info info;
	struct link_map *self = NULL;
	if (dladdr1((void *)find_libc_dlvsym, &info, (void **)&self, RTLD_DL_LINKMAP) == 0 || self == NULL)
		return NULL;
	for (struct link_map *m = self->l_next; m != NULL; m = m->l_next) {
		if (m->l_name == NULL || m->l_name[0] == '\0')
			continue; /* the vDSO */
		void *p = object_symbol(m, "dlvsym");
		if (p != NULL)
			return (dlvsym_fn)p;
	}
	return NULL;
}

VGPU_EARLY void *vgpu_libc_dlvsym_fn(void)
{
	dlvsym_fn f = atomic_load_explicit(&libc_dlvsym, memory_order_acquire);
	if (f == NULL) {
		f = find_libc_dlvsym();
		if (f == NULL)
			return NULL;
		atomic_store_explicit(&libc_dlvsym, f, memory_order_release);
	}
	return (void *)f;
}

VGPU_EARLY void *vgpu_libc_dlvsym(void *handle, const char *name, const char *version)
{
	dlvsym_fn f = (dlvsym_fn)vgpu_libc_dlvsym_fn();
	if (f == NULL) {
		vgpu_log_error("cannot find libc's dlvsym: symbol lookups fail");
		return NULL;
	}
	return f(handle, name, version);
}

/* The dlsym after ours: libc's (libdl's before glibc 2.34), or another interposer's that
 * comes after us, by version through libc's dlvsym (RTLD_NEXT: after libvgpu). No dlopen
 * here: this runs inside a sanitizer runtime's initialisation, whose dlopen interceptor is
 * not ready yet. */
VGPU_EARLY static dlsym_fn find_libc_dlsym(void)
{
	static const char *const versions[] = { "GLIBC_2.34", VGPU_GLIBC_BASE };
	dlvsym_fn vsym = (dlvsym_fn)vgpu_libc_dlvsym_fn();
	for (size_t i = 0; vsym != NULL && i < sizeof(versions) / sizeof(versions[0]); i++) {
		void *p = vsym(RTLD_NEXT, "dlsym", versions[i]);
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
