/* The tenant of the red-team suite (test/escape): a CUDA program that wants more device memory
 * than its claim and reaches the driver by one route or another.
 *
 *   tenant <route> <api> <MiB> <hold seconds>
 *
 * It dlopens libcuda.so.1 (the fake driver of library/test/fake), resolves cuInit,
 * cuCtxCreate_v2 and the allocation entry point through <route>, allocates <MiB> in 256 MiB
 * steps through <api>, prints "alloc <MiB> = <CUresult>" for each step and "held <MiB>", then
 * sleeps <hold seconds> and exits 0. What the harness asserts is what the GPU saw and whether
 * the process survived, never what this program says about itself.
 *
 * Routes: dlsym (dlsym on the driver's handle), default (RTLD_DEFAULT), next (RTLD_NEXT),
 * dlvsym (libc's own dlsym, through dlvsym(libc, "dlsym", "GLIBC_2.34")), dlmopen (the driver
 * loaded again in a new link-map namespace), dynsym (the driver's .dynsym walked from
 * dl_iterate_phdr, no dl* lookup at all), procaddr:<version>:<flags> (cuGetProcAddress_v2 as
 * dlsym returns it), realprocaddr (the driver's own cuGetProcAddress_v2 from .dynsym),
 * registered-dynsym (cuInit through the hooks first, so that the library registers, then the
 * .dynsym walk for everything else).
 * APIs: v2 (cuMemAlloc_v2), v1 (cuMemAlloc), pitch (cuMemAllocPitch_v2), managed
 * (cuMemAllocManaged), async (cuMemAllocAsync), pool (cuMemAllocFromPoolAsync), vmm
 * (cuMemCreate). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef struct {
	int type, requestedHandleTypes;
	struct { int type, id; } location;
	void *win32HandleMetaData;
	unsigned char reserved[64];
} CUmemAllocationProp;

#define MiB (1024ull * 1024ull)

struct dynsym_find {
	const char *lib, *name;
	void *addr;
};

/* The number of symbols from DT_GNU_HASH: past the highest bucket, follow its chain. */
static size_t gnu_hash_count(const uint32_t *h)
{
	uint32_t nbuckets = h[0], symoffset = h[1], bloom = h[2];
	const uint32_t *buckets = h + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
	const uint32_t *chain = buckets + nbuckets;
	uint32_t last = 0;
	for (uint32_t i = 0; i < nbuckets; i++)
		if (buckets[i] > last)
			last = buckets[i];
	if (last < symoffset)
		return symoffset;
	while (!(chain[last - symoffset] & 1))
		last++;
	return last + 1;
}

static int walk(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	struct dynsym_find *f = data;
	if (info->dlpi_name == NULL || strstr(info->dlpi_name, f->lib) == NULL)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		if (info->dlpi_phdr[i].p_type != PT_DYNAMIC)
			continue;
		ElfW(Dyn) *d = (ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
		const ElfW(Sym) *syms = NULL;
		const char *strs = NULL;
		size_t n = 0;
		for (; d->d_tag != DT_NULL; d++) {
			if (d->d_tag == DT_SYMTAB)
				syms = (const ElfW(Sym) *)d->d_un.d_ptr;
			else if (d->d_tag == DT_STRTAB)
				strs = (const char *)d->d_un.d_ptr;
			else if (d->d_tag == DT_HASH)
				n = ((const uint32_t *)d->d_un.d_ptr)[1];
			else if (d->d_tag == DT_GNU_HASH && n == 0)
				n = gnu_hash_count((const uint32_t *)d->d_un.d_ptr);
		}
		for (size_t k = 0; syms && strs && k < n; k++)
			if (syms[k].st_value != 0 && strcmp(strs + syms[k].st_name, f->name) == 0) {
				f->addr = (void *)(info->dlpi_addr + syms[k].st_value);
				return 1;
			}
	}
	return 0;
}

static void *dynsym(const char *name)
{
	struct dynsym_find f = { "libcuda.so", name, NULL };
	dl_iterate_phdr(walk, &f);
	return f.addr;
}

static const char *route;
static void *cuda;
static void *(*real_dlsym)(void *, const char *);
static CUresult (*procaddr)(const char *, void **, int, unsigned long long, int *);
static int pa_version = 12000;
static unsigned long long pa_flags;

static void *resolve(const char *name)
{
	if (strcmp(route, "dlsym") == 0 || strcmp(route, "dlmopen") == 0)
		return dlsym(cuda, name);
	if (strcmp(route, "default") == 0)
		return dlsym(RTLD_DEFAULT, name);
	if (strcmp(route, "next") == 0)
		return dlsym(RTLD_NEXT, name);
	if (strcmp(route, "dlvsym") == 0)
		return real_dlsym(cuda, name);
	if (strcmp(route, "dynsym") == 0)
		return dynsym(name);
	if (procaddr != NULL) {
		/* cuGetProcAddress takes the base name: strip a _v2 suffix */
		char base[64];
		snprintf(base, sizeof(base), "%s", name);
		char *v = strstr(base, "_v2");
		if (v != NULL)
			*v = '\0';
		void *p = NULL;
		int st = 0;
		if (procaddr(base, &p, pa_version, pa_flags, &st) != 0)
			return NULL;
		return p;
	}
	return NULL;
}

static int setup_route(void)
{
	if (strcmp(route, "dlmopen") == 0)
		cuda = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW);
	else
		cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (cuda == NULL) {
		printf("dlopen: %s\n", dlerror());
		return -1;
	}
	if (strcmp(route, "dlvsym") == 0) {
		void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
		real_dlsym = libc ? dlvsym(libc, "dlsym", "GLIBC_2.34") : NULL;
		if (real_dlsym == NULL)
			real_dlsym = libc ? dlvsym(libc, "dlsym", "GLIBC_2.2.5") : NULL;
		if (real_dlsym == NULL) {
			printf("dlvsym: no dlsym in libc\n");
			return -1;
		}
	}
	if (strncmp(route, "procaddr:", 9) == 0) {
		if (sscanf(route + 9, "%d:%llu", &pa_version, &pa_flags) != 2)
			return -1;
		procaddr = dlsym(cuda, "cuGetProcAddress_v2");
	} else if (strcmp(route, "realprocaddr") == 0) {
		procaddr = dynsym("cuGetProcAddress_v2");
	}
	if ((strncmp(route, "procaddr:", 9) == 0 || strcmp(route, "realprocaddr") == 0) && procaddr == NULL) {
		printf("no cuGetProcAddress_v2\n");
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: tenant <route> <api> <MiB> <hold seconds>\n");
		return 2;
	}
	route = argv[1];
	const char *api = argv[2];
	unsigned long long total = strtoull(argv[3], NULL, 10);
	int hold = atoi(argv[4]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("pid %d\n", (int)getpid());
	int register_first = strcmp(route, "registered-dynsym") == 0;
	if (register_first)
		route = "dynsym";
	if (setup_route() != 0)
		return 3;
	if (register_first) {
		CUresult (*hooked_init)(unsigned) = dlsym(cuda, "cuInit");
		printf("hooked cuInit = %d\n", hooked_init ? hooked_init(0) : -1);
	}
	CUresult (*init)(unsigned) = resolve("cuInit");
	CUresult (*ctx_create)(CUcontext *, unsigned, int) = resolve("cuCtxCreate_v2");
	if (init == NULL || ctx_create == NULL) {
		printf("unresolved cuInit or cuCtxCreate_v2\n");
		return 3;
	}
	CUresult r = init(0);
	printf("cuInit = %d\n", r);
	CUcontext ctx;
	if (r != 0 || ctx_create(&ctx, 0, 0) != 0)
		return 4;

	const char *sym = strcmp(api, "v1") == 0 ? "cuMemAlloc" : strcmp(api, "pitch") == 0 ? "cuMemAllocPitch_v2"
		: strcmp(api, "managed") == 0 ? "cuMemAllocManaged" : strcmp(api, "async") == 0 ? "cuMemAllocAsync"
		: strcmp(api, "pool") == 0 ? "cuMemAllocFromPoolAsync" : strcmp(api, "vmm") == 0 ? "cuMemCreate"
		: "cuMemAlloc_v2";
	void *fn = resolve(sym);
	void *pool = NULL; /* the pool technique allocates from GPU 0's default pool, got by the same route */
	if (strcmp(api, "pool") == 0) {
		CUresult (*default_pool)(void **, int) = resolve("cuDeviceGetDefaultMemPool");
		if (default_pool == NULL || default_pool(&pool, 0) != 0) {
			printf("no default memory pool\n");
			return 3;
		}
	}
	if (fn == NULL && strcmp(sym, "cuMemAlloc") == 0)
		fn = resolve("cuMemAlloc");
	if (fn == NULL) {
		printf("unresolved %s\n", sym);
		return 3;
	}
	unsigned long long held = 0;
	for (unsigned long long done = 0; done < total; done += 256) {
		unsigned long long n = total - done < 256 ? total - done : 256;
		size_t bytes = n * MiB;
		CUdeviceptr p = 0;
		unsigned long long h = 0;
		if (strcmp(api, "v1") == 0) {
			unsigned p32;
			r = ((CUresult(*)(unsigned *, unsigned))fn)(&p32, (unsigned)bytes);
		} else if (strcmp(api, "pitch") == 0) {
			size_t pitch;
			r = ((CUresult(*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))fn)(&p, &pitch, MiB, n, 4);
		} else if (strcmp(api, "managed") == 0) {
			r = ((CUresult(*)(CUdeviceptr *, size_t, unsigned))fn)(&p, bytes, 1);
		} else if (strcmp(api, "async") == 0) {
			r = ((CUresult(*)(CUdeviceptr *, size_t, void *))fn)(&p, bytes, NULL);
		} else if (strcmp(api, "pool") == 0) {
			r = ((CUresult(*)(CUdeviceptr *, size_t, void *, void *))fn)(&p, bytes, pool, NULL);
		} else if (strcmp(api, "vmm") == 0) {
			CUmemAllocationProp prop = { .type = 1, .location = { 1, 0 } };
			r = ((CUresult(*)(unsigned long long *, size_t, const CUmemAllocationProp *, unsigned long long))fn)(
				&h, bytes, &prop, 0);
		} else {
			r = ((CUresult(*)(CUdeviceptr *, size_t))fn)(&p, bytes);
		}
		printf("alloc %llu = %d\n", n, r);
		if (r == 0)
			held += n;
	}
	printf("held %llu\n", held);
	sleep((unsigned)hold);
	return 0;
}
