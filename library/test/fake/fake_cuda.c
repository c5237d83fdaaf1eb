/* TEST DOUBLE: a fake libcuda.so.1 with exactly the entry points libvgpu hooks or calls,
 * plus what the test programs need (contexts, synchronisation). Device memory is host
 * memory; usage is recorded per process in the shared state (fake_state.h); a launch
 * occupies the device for blocks * FAKE_NS_PER_BLOCK ns, serialised like one GPU. The
 * CUDA arrays, the device heap and the threads' stacks take memory like allocations. The
 * virtual memory API is in fake_vmm.c, streams, events and stream-ordered frees in
 * fake_stream.c, memory pools and stream-ordered allocations in fake_pool.c, graphs' memory
 * nodes in fake_graph.c. A context is its device; each thread has a stack of them
 * (cuCtxPushCurrent_v2 / cuCtxPopCurrent_v2), cuCtxCreate and cuCtxSetCurrent replace its top. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"

static __thread int current_dev = -1; /* device index (shared state), not the CUDA ordinal */
static __thread int current_ordinal = -1;
/* The thread's context stack below the current one (cuCtxPushCurrent_v2): CUDA ordinals, -1
 * for "none". A context is its device's ordinal + 1. */
#define FAKE_CTX_DEPTH 8
static __thread int ctx_below[FAKE_CTX_DEPTH];
static __thread int ctx_depth;
static int initialised;

/* Process-local table of allocations: key -> (bytes, device). */
static struct fake_alloc *allocs;
static size_t nallocs, capallocs;
static uint32_t next_v1 = 0x1000;

static CUresult record(uint64_t key, uint64_t bytes, int dev, void *host)
{
	if (nallocs == capallocs) {
		size_t ncap = capallocs ? capallocs * 2 : 256;
		struct fake_alloc *n = realloc(allocs, ncap * sizeof(*n));
		if (n == NULL)
			return CUDA_ERROR_OUT_OF_MEMORY;
		allocs = n;
		capallocs = ncap;
	}
	allocs[nallocs++] = (struct fake_alloc){ key, bytes, dev, host, 1, 0, 0 };
	return CUDA_SUCCESS;
}

static int unrecord(uint64_t key, struct fake_alloc *out)
{
	for (size_t i = 0; i < nallocs; i++) {
		if (allocs[i].key == key) {
			*out = allocs[i];
			allocs[i] = allocs[--nallocs];
			return 1;
		}
	}
	return 0;
}

struct fake_alloc *fake_alloc_find(uint64_t key)
{
	for (size_t i = 0; i < nallocs; i++)
		if (allocs[i].key == key)
			return &allocs[i];
	return NULL;
}

int fake_initialised(void) { return initialised; }

/* CUDA ordinal -> device index: CUDA_VISIBLE_DEVICES (indices), else the identity. -1 if
 * the ordinal does not exist. */
static int nvisible = -1;
static int visible[FAKE_MAX_DEV];

int fake_device_of(int ordinal)
{
	struct fake_state *s = fake_state();
	if (nvisible < 0) {
		const char *v = getenv("CUDA_VISIBLE_DEVICES");
		int n = 0;
		if (v == NULL) {
			for (; n < (int)s->ndev; n++)
				visible[n] = n;
		} else {
			for (const char *p = v; *p && n < FAKE_MAX_DEV;) {
				char *end;
				long i = strtol(p, &end, 10);
				if (end == p || i < 0 || i >= (long)s->ndev)
					break; /* like the driver: the list ends at the first invalid entry */
				visible[n++] = (int)i;
				p = *end == ',' ? end + 1 : end;
			}
		}
		nvisible = n;
	}
	return ordinal >= 0 && ordinal < nvisible ? visible[ordinal] : -1;
}

static CUresult need_ctx(void)
{
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	return current_dev < 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

API CUresult cuInit(unsigned int flags)
{
	(void)flags;
	fake_state();
	initialised = 1;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *count)
{
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	fake_device_of(0);
	*count = nvisible;
	/* a driver that counts more devices than it can describe (its UUIDs fail past nvisible) */
	const char *claimed = getenv("FAKE_DEVICE_COUNT");
	if (claimed != NULL && atoi(claimed) > 0)
		*count = atoi(claimed);
	return CUDA_SUCCESS;
}

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice ordinal)
{
	struct fake_state *s = fake_state();
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	int dev = fake_device_of(ordinal);
	if (dev < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	const char *p = s->uuid[dev] + 4; /* after "GPU-" */
	int n = 0;
	while (*p && n < 16) {
		if (*p == '-') { p++; continue; }
		uuid->bytes[n++] = (char)(hexval(p[0]) << 4 | hexval(p[1]));
		p += 2;
	}
	return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice ordinal)
{
	struct fake_state *s = fake_state();
	int dev = fake_device_of(ordinal);
	if (dev < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = s->total[dev];
	return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
	size_t b;
	CUresult r = cuDeviceTotalMem_v2(&b, dev);
	if (r == CUDA_SUCCESS)
		*bytes = b > 0xffffffffu ? 0xffffffffu : (unsigned int)b;
	return r;
}

/* A context is its device; creating the first one on a device costs FAKE_CTX_OVERHEAD
 * bytes the hooks never see (like a real context). */
API CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice ordinal)
{
	(void)flags;
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	int dev = fake_device_of(ordinal);
	if (dev < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	current_dev = dev; /* the device index; cuCtxGetDevice answers the ordinal */
	current_ordinal = ordinal;
	*ctx = (CUcontext)(uintptr_t)(ordinal + 1);
	const char *ov = getenv("FAKE_CTX_OVERHEAD");
	fake_lock();
	struct fake_proc *p = fake_self();
	if (ov != NULL && !(p->ctx_charged & (1 << dev))) {
		p->ctx_charged |= 1 << dev;
		fake_charge(dev, (int64_t)strtoull(ov, NULL, 10));
	}
	fake_unlock();
	return CUDA_SUCCESS;
}

API CUresult cuCtxGetDevice(CUdevice *dev)
{
	CUresult r = need_ctx();
	if (r == CUDA_SUCCESS)
		*dev = current_ordinal;
	return r;
}

API CUresult cuCtxSynchronize(void)
{
	CUresult r = need_ctx();
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t until = __atomic_load_n(&fake_state()->gpu_free_ns[current_dev], __ATOMIC_RELAXED);
	uint64_t now = fake_now_ns();
	if (until > now) {
		struct timespec ts = { (time_t)((until - now) / 1000000000ull), (long)((until - now) % 1000000000ull) };
		nanosleep(&ts, NULL);
	}
	fake_streams_drain();
	return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext *ctx)
{
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	*ctx = current_ordinal < 0 ? NULL : (CUcontext)(uintptr_t)(current_ordinal + 1);
	return CUDA_SUCCESS;
}

int fake_current_ordinal(void) { return current_ordinal; }

static CUresult make_current(CUcontext ctx)
{
	int ordinal = ctx == NULL ? -1 : (int)(uintptr_t)ctx - 1;
	int dev = ordinal < 0 ? -1 : fake_device_of(ordinal);
	if (ordinal >= 0 && dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	current_ordinal = ordinal;
	current_dev = dev;
	return CUDA_SUCCESS;
}

/* Replaces the top of the thread's stack (NULL: no context current). */
API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	return make_current(ctx);
}

API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ctx == NULL || ctx_depth == FAKE_CTX_DEPTH)
		return CUDA_ERROR_INVALID_VALUE;
	int below = current_ordinal;
	CUresult r = make_current(ctx);
	if (r == CUDA_SUCCESS)
		ctx_below[ctx_depth++] = below;
	return r;
}

API CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (current_ordinal < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx != NULL)
		*ctx = (CUcontext)(uintptr_t)(current_ordinal + 1);
	int below = ctx_depth > 0 ? ctx_below[--ctx_depth] : -1;
	return make_current(below < 0 ? NULL : (CUcontext)(uintptr_t)(below + 1));
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	CUresult r = need_ctx();
	if (r != CUDA_SUCCESS)
		return r;
	struct fake_state *s = fake_state();
	fake_lock();
	uint64_t used = 0;
	for (int i = 0; i < FAKE_MAX_PROCS; i++)
		if (s->procs[i].pid != 0 && fake_pid_alive(s->procs[i].pid))
			used += s->procs[i].used[current_dev];
	fake_unlock();
	*total = s->total[current_dev];
	*free_bytes = used < *total ? *total - used : 0;
	return CUDA_SUCCESS;
}

API CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total)
{
	size_t f, t;
	CUresult r = cuMemGetInfo_v2(&f, &t);
	if (r == CUDA_SUCCESS) {
		*free_bytes = f > 0xffffffffu ? 0xffffffffu : (unsigned int)f;
		*total = t > 0xffffffffu ? 0xffffffffu : (unsigned int)t;
	}
	return r;
}

CUresult fake_alloc_on(int dev, uint64_t bytes, uint64_t *key, int v1)
{
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (bytes == 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct fake_state *s = fake_state();
	fake_lock();
	uint64_t used = 0;
	for (int i = 0; i < FAKE_MAX_PROCS; i++)
		if (s->procs[i].pid != 0 && (s->procs[i].pid == getpid() || fake_pid_alive(s->procs[i].pid)))
			used += s->procs[i].used[dev];
	if (used + bytes > s->total[dev]) {
		fake_unlock();
		return CUDA_ERROR_OUT_OF_MEMORY; /* the physical device is full */
	}
	fake_charge(dev, (int64_t)bytes);
	fake_unlock();
	void *host = NULL;
	if (v1) {
		*key = __atomic_fetch_add(&next_v1, 0x1000, __ATOMIC_RELAXED);
	} else {
		host = malloc(bytes); /* untouched: costs address space, not memory */
		if (host == NULL) {
			fake_lock();
			fake_charge(dev, -(int64_t)bytes);
			fake_unlock();
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		*key = (uint64_t)(uintptr_t)host;
	}
	return record(*key, bytes, dev, host);
}

CUresult fake_free_key(uint64_t key)
{
	struct fake_alloc a;
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!unrecord(key, &a))
		return CUDA_ERROR_INVALID_VALUE;
	free(a.host);
	fake_lock();
	fake_charge(a.dev, -(int64_t)a.bytes);
	fake_unlock();
	return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	CUresult r = need_ctx();
	uint64_t key;
	if (r == CUDA_SUCCESS && (r = fake_alloc_on(current_dev, bytesize, &key, 0)) == CUDA_SUCCESS)
		*dptr = key;
	return r;
}

API CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
	CUresult r = need_ctx();
	uint64_t key;
	if (r == CUDA_SUCCESS && (r = fake_alloc_on(current_dev, bytesize, &key, 1)) == CUDA_SUCCESS)
		*dptr = (CUdeviceptr_v1)key;
	return r;
}

API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	(void)flags;
	return cuMemAlloc_v2(dptr, bytesize);
}

API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elem)
{
	(void)elem;
	size_t p = (width + 255) / 256 * 256; /* this fake aligns rows to 256 bytes */
	CUresult r = cuMemAlloc_v2(dptr, p * height);
	if (r == CUDA_SUCCESS)
		*pitch = p;
	return r;
}

API CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
			     unsigned int elem)
{
	(void)elem;
	unsigned int p = (width + 255) / 256 * 256;
	CUresult r = cuMemAlloc(dptr, p * height);
	if (r == CUDA_SUCCESS)
		*pitch = p;
	return r;
}

API CUresult cuMemFree_v2(CUdeviceptr dptr) { return fake_free_key(dptr); }
API CUresult cuMemFree(CUdeviceptr_v1 dptr) { return fake_free_key(dptr); }

/* CUDA arrays hold width x height x depth x element bytes (mip levels summed), laid out
 * without padding in this fake; the handle is the allocation's key. */
static uint64_t fake_elem(CUarray_format f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
	case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
	default: return 0;
	}
}

static CUresult fake_array(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned ch, unsigned levels,
			   uint64_t *key)
{
	CUresult r = need_ctx();
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t elem = fake_elem(f) * ch, bytes = 0;
	if (w == 0 || elem == 0 || (ch != 1 && ch != 2 && ch != 4) || levels == 0)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned i = 0; i < levels; i++) {
		bytes += w * (h ? h : 1) * (d ? d : 1) * elem;
		w = w > 1 ? w / 2 : 1;
		h = h > 1 ? h / 2 : h;
		d = d > 1 ? d / 2 : d;
	}
	return fake_alloc_on(current_dev, bytes, key, 0);
}

API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
	uint64_t key;
	CUresult r = fake_array(d->Width, d->Height, 0, d->Format, d->NumChannels, 1, &key);
	if (r == CUDA_SUCCESS)
		*a = (CUarray)(uintptr_t)key;
	return r;
}
API CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
	CUDA_ARRAY_DESCRIPTOR d2 = { d->Width, d->Height, d->Format, d->NumChannels };
	return cuArrayCreate_v2(a, &d2);
}
API CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
	uint64_t key;
	CUresult r = fake_array(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 1, &key);
	if (r == CUDA_SUCCESS)
		*a = (CUarray)(uintptr_t)key;
	return r;
}
API CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
	CUDA_ARRAY3D_DESCRIPTOR d2 = { d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags };
	return cuArray3DCreate_v2(a, &d2);
}
API CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels)
{
	uint64_t key;
	CUresult r = fake_array(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, levels, &key);
	if (r == CUDA_SUCCESS)
		*a = (CUmipmappedArray)(uintptr_t)key;
	return r;
}
API CUresult cuArrayDestroy(CUarray a) { return fake_free_key((uint64_t)(uintptr_t)a); }
API CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return fake_free_key((uint64_t)(uintptr_t)a); }

/* Modules and libraries hold device memory from their load to their unload; the handle is
 * the allocation's key. */
static CUresult fake_module_load(const void *image, uint64_t *key)
{
	CUresult r = need_ctx();
	if (r != CUDA_SUCCESS)
		return r;
	if (image == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	const struct fake_module_image *m = image;
	uint64_t bytes = FAKE_MODULE_CODE_BYTES;
	if (memcmp(m->magic, FAKE_MODULE_MAGIC, sizeof(FAKE_MODULE_MAGIC)) == 0)
		bytes += m->globals_bytes;
	return fake_alloc_on(current_dev, bytes, key, 0);
}

static CUresult fake_module_file(const char *path, uint64_t *key)
{
	struct fake_module_image m = { { 0 }, 0 };
	FILE *f = path ? fopen(path, "rb") : NULL;
	if (f == NULL)
		return CUDA_ERROR_FILE_NOT_FOUND;
	size_t got = fread(&m, 1, sizeof(m), f);
	fclose(f);
	if (got == 0)
		return CUDA_ERROR_INVALID_IMAGE;
	return fake_module_load(&m, key);
}

API CUresult cuModuleLoadData(CUmodule *mod, const void *image)
{
	uint64_t key;
	CUresult r = fake_module_load(image, &key);
	if (r == CUDA_SUCCESS)
		*mod = (CUmodule)(uintptr_t)key;
	return r;
}
API CUresult cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned n, CUjit_option *o, void **v)
{
	(void)n; (void)o; (void)v;
	return cuModuleLoadData(mod, image);
}
API CUresult cuModuleLoadFatBinary(CUmodule *mod, const void *fatbin) { return cuModuleLoadData(mod, fatbin); }
API CUresult cuModuleLoad(CUmodule *mod, const char *path)
{
	uint64_t key;
	CUresult r = fake_module_file(path, &key);
	if (r == CUDA_SUCCESS)
		*mod = (CUmodule)(uintptr_t)key;
	return r;
}
API CUresult cuModuleUnload(CUmodule mod) { return fake_free_key((uint64_t)(uintptr_t)mod); }
API CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned nj,
			       CUlibraryOption *lo, void **lv, unsigned nl)
{
	(void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
	uint64_t key;
	CUresult r = fake_module_load(code, &key);
	if (r == CUDA_SUCCESS)
		*lib = (CUlibrary)(uintptr_t)key;
	return r;
}
API CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *path, CUjit_option *jo, void **jv, unsigned nj,
				   CUlibraryOption *lo, void **lv, unsigned nl)
{
	(void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
	uint64_t key;
	CUresult r = fake_module_file(path, &key);
	if (r == CUDA_SUCCESS)
		*lib = (CUlibrary)(uintptr_t)key;
	return r;
}
API CUresult cuLibraryUnload(CUlibrary lib) { return fake_free_key((uint64_t)(uintptr_t)lib); }

/* A device of FAKE_SM_COUNT SMs of FAKE_THREADS_PER_SM threads each. */
#define FAKE_SM_COUNT 16
#define FAKE_THREADS_PER_SM 2048

API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attr, CUdevice ordinal)
{
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (fake_device_of(ordinal) < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (attr == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
		*pi = FAKE_SM_COUNT;
	else if (attr == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
		*pi = FAKE_THREADS_PER_SM;
	else
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

/* The device heap and the stack of every resident thread are device memory, held from the
 * cuCtxSetLimit that sizes them (one context per device in this fake). */
static uint64_t limit_held[FAKE_MAX_DEV][2];

API CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
	CUresult r = need_ctx();
	if (r != CUDA_SUCCESS)
		return r;
	if (limit == CU_LIMIT_PRINTF_FIFO_SIZE)
		return CUDA_SUCCESS;
	if (limit != CU_LIMIT_MALLOC_HEAP_SIZE && limit != CU_LIMIT_STACK_SIZE)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t want = limit == CU_LIMIT_STACK_SIZE ? (uint64_t)value * FAKE_SM_COUNT * FAKE_THREADS_PER_SM : value;
	uint64_t *held = &limit_held[current_dev][limit == CU_LIMIT_MALLOC_HEAP_SIZE];
	struct fake_state *s = fake_state();
	fake_lock();
	uint64_t used = 0;
	for (int i = 0; i < FAKE_MAX_PROCS; i++)
		if (s->procs[i].pid != 0 && (s->procs[i].pid == getpid() || fake_pid_alive(s->procs[i].pid)))
			used += s->procs[i].used[current_dev];
	if (want > *held && used + (want - *held) > s->total[current_dev]) {
		fake_unlock();
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	fake_charge(current_dev, (int64_t)want - (int64_t)*held);
	*held = want;
	fake_unlock();
	return CUDA_SUCCESS;
}

static uint64_t ns_per_block(void)
{
	static int64_t v = -1;
	if (v < 0) {
		const char *e = getenv("FAKE_NS_PER_BLOCK");
		v = e ? (int64_t)strtoull(e, NULL, 10) : 1000;
	}
	return (uint64_t)v;
}

CUresult fake_launch(uint64_t blocks)
{
	CUresult r = need_ctx();
	if (r != CUDA_SUCCESS || ns_per_block() == 0)
		return r;
	struct fake_state *s = fake_state();
	int dev = current_dev;
	uint64_t busy = blocks * ns_per_block();
	fake_lock();
	uint64_t now = fake_now_ns();
	uint64_t start = s->gpu_free_ns[dev] > now ? s->gpu_free_ns[dev] : now;
	s->gpu_free_ns[dev] = start + busy;
	s->busy_total_ns[dev] += busy;
	struct fake_interval *iv = &s->ring[dev][s->ring_head[dev]++ % FAKE_RING];
	*iv = (struct fake_interval){ (int32_t)getpid(), 0, start, start + busy };
	fake_unlock();
	/* a bounded launch queue: more than 20 ms of queued work blocks the launcher */
	if (start + busy > now + 20000000ull) {
		uint64_t w = start + busy - now - 20000000ull;
		struct timespec ts = { (time_t)(w / 1000000000ull), (long)(w % 1000000000ull) };
		nanosleep(&ts, NULL);
	}
	return CUDA_SUCCESS;
}

#define BLOCKS(gx, gy, gz) ((uint64_t)(gx) * (gy) * (gz))

API CUresult cuLaunch(CUfunction f) { (void)f; return fake_launch(1); }
API CUresult cuLaunchGrid(CUfunction f, int w, int h)
{
	(void)f;
	return w > 0 && h > 0 ? fake_launch(BLOCKS(w, h, 1)) : CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream st) { (void)st; return cuLaunchGrid(f, w, h); }

API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
			    unsigned bz, unsigned sh, CUstream st, void **pa, void **ex)
{
	(void)f; (void)bx; (void)by; (void)bz; (void)sh; (void)st; (void)pa; (void)ex;
	return fake_launch(BLOCKS(gx, gy, gz));
}
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
				 unsigned bz, unsigned sh, CUstream st, void **pa, void **ex)
{
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sh, st, pa, ex);
}
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
				       unsigned by, unsigned bz, unsigned sh, CUstream st, void **pa)
{
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sh, st, pa, NULL);
}
API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
					    unsigned by, unsigned bz, unsigned sh, CUstream st, void **pa)
{
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sh, st, pa, NULL);
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **pa, void **ex)
{
	(void)f; (void)pa; (void)ex;
	return c ? fake_launch(BLOCKS(c->gridDimX, c->gridDimY, c->gridDimZ)) : CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **pa, void **ex)
{
	return cuLaunchKernelEx(c, f, pa, ex);
}

/* Baselines for the benchmark: the same functions under names libvgpu does not hook. */
API CUresult fake_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
				 unsigned bz, unsigned sh, CUstream st, void **pa, void **ex)
{
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sh, st, pa, ex);
}
API CUresult fake_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { return cuMemAlloc_v2(dptr, bytesize); }
API CUresult fake_cuMemFree_v2(CUdeviceptr dptr) { return cuMemFree_v2(dptr); }

/* cuGetProcAddress: the published version history, like the driver's. */
API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
				 CUdriverProcAddressQueryResult *status);
struct proc_entry { const char *base, *name; int min_version, ptds; void *fn; };
/* An entry point the driver hands out without exporting it under any name. */
static CUresult internal_instantiate(CUgraphExec *exec, CUgraph graph, unsigned long long flags)
{
	return cuGraphInstantiateWithFlags(exec, graph, flags);
}
#define E(base, name, ver, ptds) { #base, #name, ver, ptds, (void *)name }
static const struct proc_entry proc_table[] = {
	E(cuInit, cuInit, 2000, 0),
	E(cuDeviceGetCount, cuDeviceGetCount, 2000, 0),
	E(cuDeviceGetUuid, cuDeviceGetUuid, 9020, 0),
	E(cuDeviceTotalMem, cuDeviceTotalMem, 2000, 0),
	E(cuDeviceTotalMem, cuDeviceTotalMem_v2, 3020, 0),
	E(cuCtxCreate, cuCtxCreate_v2, 3020, 0),
	E(cuCtxGetDevice, cuCtxGetDevice, 2000, 0),
	E(cuCtxSynchronize, cuCtxSynchronize, 2000, 0),
	E(cuCtxGetCurrent, cuCtxGetCurrent, 2000, 0),
	E(cuCtxSetCurrent, cuCtxSetCurrent, 4000, 0),
	E(cuCtxPushCurrent, cuCtxPushCurrent_v2, 4000, 0),
	E(cuCtxPopCurrent, cuCtxPopCurrent_v2, 4000, 0),
	E(cuStreamCreate, cuStreamCreate, 2000, 0),
	E(cuStreamSynchronize, cuStreamSynchronize, 2000, 0),
	E(cuStreamQuery, cuStreamQuery, 2000, 0),
	E(cuStreamGetCtx, cuStreamGetCtx, 9020, 0),
	E(cuStreamIsCapturing, cuStreamIsCapturing, 10000, 0),
	E(cuStreamWaitValue32, cuStreamWaitValue32, 8000, 0),
	E(cuEventCreate, cuEventCreate, 2000, 0),
	E(cuEventRecord, cuEventRecord, 2000, 0),
	E(cuEventQuery, cuEventQuery, 2000, 0),
	E(cuEventDestroy, cuEventDestroy_v2, 4000, 0),
	E(cuMemGetInfo, cuMemGetInfo, 2000, 0),
	E(cuMemGetInfo, cuMemGetInfo_v2, 3020, 0),
	E(cuMemAlloc, cuMemAlloc, 2000, 0),
	E(cuMemAlloc, cuMemAlloc_v2, 3020, 0),
	E(cuMemAllocPitch, cuMemAllocPitch, 2000, 0),
	E(cuMemAllocPitch, cuMemAllocPitch_v2, 3020, 0),
	E(cuMemAllocManaged, cuMemAllocManaged, 6000, 0),
	E(cuMemAllocAsync, cuMemAllocAsync, 11020, 0),
	E(cuMemAllocAsync, cuMemAllocAsync_ptsz, 11020, 1),
	E(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0),
	E(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz, 11020, 1),
	E(cuMemPoolCreate, cuMemPoolCreate, 11020, 0),
	E(cuMemPoolDestroy, cuMemPoolDestroy, 11020, 0),
	E(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, 11020, 0),
	E(cuDeviceGetMemPool, cuDeviceGetMemPool, 11020, 0),
	E(cuDeviceSetMemPool, cuDeviceSetMemPool, 11020, 0),
	E(cuMemGetDefaultMemPool, cuMemGetDefaultMemPool, 13000, 0),
	E(cuMemGetMemPool, cuMemGetMemPool, 13000, 0),
	E(cuMemSetMemPool, cuMemSetMemPool, 13000, 0),
	E(cuMemCreate, cuMemCreate, 10020, 0),
	E(cuMemRelease, cuMemRelease, 10020, 0),
	E(cuMemAddressReserve, cuMemAddressReserve, 10020, 0),
	E(cuMemAddressFree, cuMemAddressFree, 10020, 0),
	E(cuMemMap, cuMemMap, 10020, 0),
	E(cuMemUnmap, cuMemUnmap, 10020, 0),
	E(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, 0),
	E(cuArrayCreate, cuArrayCreate, 2000, 0),
	E(cuArrayCreate, cuArrayCreate_v2, 3020, 0),
	E(cuArray3DCreate, cuArray3DCreate, 2000, 0),
	E(cuArray3DCreate, cuArray3DCreate_v2, 3020, 0),
	E(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0),
	E(cuArrayDestroy, cuArrayDestroy, 2000, 0),
	E(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0),
	E(cuModuleLoad, cuModuleLoad, 2000, 0),
	E(cuModuleLoadData, cuModuleLoadData, 2000, 0),
	E(cuModuleLoadDataEx, cuModuleLoadDataEx, 2010, 0),
	E(cuModuleLoadFatBinary, cuModuleLoadFatBinary, 2000, 0),
	E(cuModuleUnload, cuModuleUnload, 2000, 0),
	E(cuLibraryLoadData, cuLibraryLoadData, 12000, 0),
	E(cuLibraryLoadFromFile, cuLibraryLoadFromFile, 12000, 0),
	E(cuLibraryUnload, cuLibraryUnload, 12000, 0),
	E(cuCtxSetLimit, cuCtxSetLimit, 3010, 0),
	E(cuDeviceGetAttribute, cuDeviceGetAttribute, 2000, 0),
	E(cuMemFree, cuMemFree, 2000, 0),
	E(cuMemFree, cuMemFree_v2, 3020, 0),
	E(cuMemFreeAsync, cuMemFreeAsync, 11020, 0),
	E(cuMemFreeAsync, cuMemFreeAsync_ptsz, 11020, 1),
	E(cuLaunch, cuLaunch, 2000, 0),
	E(cuLaunchGrid, cuLaunchGrid, 2000, 0),
	E(cuLaunchGridAsync, cuLaunchGridAsync, 2000, 0),
	E(cuLaunchKernel, cuLaunchKernel, 4000, 0),
	E(cuLaunchKernel, cuLaunchKernel_ptsz, 7000, 1),
	E(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 0),
	E(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz, 9000, 1),
	E(cuLaunchKernelEx, cuLaunchKernelEx, 11060, 0),
	E(cuLaunchKernelEx, cuLaunchKernelEx_ptsz, 11060, 1),
	E(cuGraphCreate, cuGraphCreate, 10000, 0),
	E(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040, 0),
	E(cuGraphDestroyNode, cuGraphDestroyNode, 10000, 0),
	E(cuGraphDestroy, cuGraphDestroy, 10000, 0),
	E(cuGraphClone, cuGraphClone, 10000, 0),
	E(cuGraphNodeFindInClone, cuGraphNodeFindInClone, 10000, 0),
	E(cuGraphAddKernelNode, cuGraphAddKernelNode, 10000, 0),
	E(cuGraphAddKernelNode, cuGraphAddKernelNode_v2, 12000, 0),
	E(cuGraphAddChildGraphNode, cuGraphAddChildGraphNode, 10000, 0),
	E(cuGraphChildGraphNodeGetGraph, cuGraphChildGraphNodeGetGraph, 10000, 0),
	E(cuGraphGetNodes, cuGraphGetNodes, 10000, 0),
	E(cuGraphNodeGetType, cuGraphNodeGetType, 10000, 0),
	E(cuGraphKernelNodeGetParams, cuGraphKernelNodeGetParams, 10000, 0),
	E(cuGraphKernelNodeGetParams, cuGraphKernelNodeGetParams_v2, 12000, 0),
	/* the base name means cuGraphInstantiateWithFlags's three arguments from CUDA 12.0 */
	E(cuGraphInstantiate, cuGraphInstantiate, 10000, 0),
	E(cuGraphInstantiate, cuGraphInstantiate_v2, 11000, 0),
	E(cuGraphInstantiate, cuGraphInstantiateWithFlags, 12000, 0),
	{ "cuGraphInstantiate", "internal_instantiate", 12080, 0, (void *)internal_instantiate },
	E(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0),
	E(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, 0),
	E(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz, 12000, 1),
	E(cuGraphExecDestroy, cuGraphExecDestroy, 10000, 0),
	E(cuGraphLaunch, cuGraphLaunch, 10000, 0),
	E(cuGraphLaunch, cuGraphLaunch_ptsz, 10000, 1),
	E(cuGetProcAddress, cuGetProcAddress, 11030, 0),
	E(cuGetProcAddress, cuGetProcAddress_v2, 12000, 0),
};

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	const struct proc_entry *best = NULL;
	int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
	for (int pass = 0; pass < 2 && best == NULL; pass++, ptds = 0) {
		for (size_t i = 0; i < sizeof(proc_table) / sizeof(proc_table[0]); i++) {
			const struct proc_entry *e = &proc_table[i];
			if (strcmp(e->base, symbol) != 0 || e->ptds != ptds || e->min_version > version)
				continue;
			if (best == NULL || e->min_version > best->min_version)
				best = e;
		}
	}
	*pfn = best ? best->fn : NULL;
	return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
				 CUdriverProcAddressQueryResult *status)
{
	CUresult r = lookup(symbol, pfn, version, flags);
	if (status != NULL)
		*status = r == CUDA_SUCCESS ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return r;
}

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	return lookup(symbol, pfn, version, flags);
}
