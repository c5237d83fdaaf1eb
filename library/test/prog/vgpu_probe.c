/* A CUDA "application" for the preload tests, linked against the fake driver like a
 * program linked with -lcuda. Commands:
 *   routes <linked|dlsym|default|next|oldsym|vsymdefault|vsymnext|procaddr>  resolve every hooked entry point
 *        through one route, check it is libvgpu's hook for exactly that variant, then check
 *        the limit through the resolved functions
 *   init                 cuInit and nvmlInit_v2 results
 *   info                 memory info through CUDA and NVML, the NVML process list
 *   busy <MiB>           allocate, then launch a small kernel every 20 ms; "busy" after the first
 *   nvmlviews <pid> <0|1>  allocate 16 MiB, launch a kernel (1) or not (0), then every NVML
 *                        listing of processes, samples, sessions and accounting, each asked three ways (a
 *                        NULL buffer, a buffer of 0 records, a buffer of 64), one line each:
 *                        "<call> query=<ret>/<count> small=<ret>/<count> list=<ret>/<count>
 *                        pids=<pid> ..."; then the accounting statistics of <pid> (a
 *                        neighbour's host PID) and of its own
 *   alloc <MiB>...       print the PID (as the process sees it), allocate, print each result, keep
 *   hold <MiB>           the same, then print "held" and wait to be killed
 *   fork <MiB> <MiB> <MiB>  allocate the first; a forked child allocates the second and exits
 *                        without freeing; then the parent allocates the third
 *   modules              modules and libraries of 200 MiB of globals loaded and unloaded through
 *                        each entry point, 200 MiB allocated while each is loaded and after
 *   fill <MiB> <dir>     allocate chunks until OOM; in phases driven by files in <dir>
 *   vmm <MiB> <max>      the CUDA Programming Guide's virtual memory pattern in a loop: reserve a
 *                        range, create <MiB>, map it, release the handle at once; until a call
 *                        fails or <max> rounds; then allocate, unmap everything, allocate again
 *   vmmrefs <MiB>        a handle retained from its mapping, a handle mapped twice: what stays
 *                        charged after each release and unmap
 *   asyncfree <MiB> <stream|ptsz>  a stream-ordered free queued behind a wait that does not
 *                        end: allocate <MiB> while it is queued, then let the stream go on and
 *                        allocate again (on a stream of its own, or the per-thread default
 *                        stream through the _ptsz entry points)
 *   pools <device|location>  two GPUs, GPU 1's context current: stream-ordered allocations on
 *                        GPU 0 (its pools however obtained: default and current pools by the
 *                        device getters or CUDA 13's location ones; a stream of its context; no
 *                        context current), a pool created where libvgpu cannot see it, GPU 1's
 *                        own default stream; one line per allocation "<case> <first|second> = <ret>"
 *   arrays               each CUDA array entry point: one over the limit, one of half the limit,
 *                        an allocation while it is held, the destroy, an allocation after it
 *   graphs               graphs' memory allocation nodes, through each instantiation entry point
 *                        (exported, and cuGetProcAddress's "cuGraphInstantiate" before and from
 *                        CUDA 12.0): over the limit, half the limit held while the executable
 *                        lives, given back by cuGraphExecDestroy; a destroyed node, a destroyed
 *                        graph whose handle comes back, a clone
 *   limits               cuCtxSetLimit's heap and stack sizes up and down, an allocation after each
 *   launch <seconds> <blocks> [kernel|grid|gridasync|legacy]  launch kernels back to back
 *                        (core-limit measurement) through cuLaunchKernel (the default) or a
 *                        legacy entry point (cuLaunchGrid(blocks x 1), cuLaunchGridAsync, cuLaunch)
 *   graphlaunch <nodes> <blocks> <launches> <flat|child>  a graph of <nodes> kernels of
 *                        <blocks> blocks (child: inside a parent graph as a child graph node),
 *                        launched <launches> times back to back (core-limit measurement)
 *   wake <root>          the wake signal (contract §16): whether <root>'s core.wake was written
 *                        at the first launch, during back-to-back launches, at a graph launch
 *                        after an idle spell
 *   follow <root> <uuid> <pct>  a launch; the allowance file set to <pct> for <uuid>; a launch
 *                        after VGPU_ALLOWANCE_CHECK_NS: the shared bucket's rate and recorded
 *                        target of GPU position 0 before and after
 *   stdin                cuInit, an allocation, then read a line from stdin and print it
 * Results are printed, never asserted here: the harness asserts what it reads. */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../src/core_file.h"
#include "../../src/core_limiter.h"
#include "../../src/core_wake.h"
#include "../../src/hooks.h"
#include "../fake/fake_cuda.h"

CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cuCtxSynchronize(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, uint32_t value, unsigned int flags);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
			     unsigned long long flags);

/* dlsym as an application built on glibc < 2.34 references it */
extern void *old_dlsym(void *, const char *);
__asm__(".symver old_dlsym, dlsym@GLIBC_2.2.5");

#define MiB (1024ull * 1024ull)
static int failures;
#define FAIL(...) (printf("FAIL " __VA_ARGS__), printf("\n"), failures++)

static uint64_t limit_bytes(void)
{
	const char *v = getenv("CUDA_MEM_LIMIT_0");
	return v ? strtoull(v, NULL, 10) * MiB : 0;
}

static void setup(void)
{
	CUcontext ctx;
	CUresult r = cuInit(0);
	if (r != CUDA_SUCCESS) {
		printf("cuInit=%d\n", r);
		exit(0);
	}
	if (cuCtxCreate_v2(&ctx, 0, 0) != CUDA_SUCCESS)
		exit(5);
}

#define N(x) { #x, (void *)&x }
static const struct { const char *name; void *linked; } cuda_names[] = {
	N(cuInit), N(cuGetProcAddress), N(cuGetProcAddress_v2), N(cuDeviceTotalMem), N(cuDeviceTotalMem_v2),
	N(cuMemGetInfo), N(cuMemGetInfo_v2), N(cuMemAlloc), N(cuMemAlloc_v2), N(cuMemAllocPitch),
	N(cuMemAllocPitch_v2), N(cuMemAllocManaged), N(cuMemAllocAsync), N(cuMemAllocAsync_ptsz),
	N(cuMemAllocFromPoolAsync), N(cuMemAllocFromPoolAsync_ptsz), N(cuMemPoolCreate), N(cuMemPoolDestroy),
	N(cuDeviceGetDefaultMemPool), N(cuDeviceGetMemPool), N(cuDeviceSetMemPool), N(cuMemGetDefaultMemPool),
	N(cuMemGetMemPool), N(cuMemSetMemPool), N(cuMemCreate), N(cuMemRelease),
	N(cuMemMap), N(cuMemUnmap), N(cuMemRetainAllocationHandle), N(cuArrayCreate), N(cuArrayCreate_v2),
	N(cuArray3DCreate), N(cuArray3DCreate_v2), N(cuMipmappedArrayCreate), N(cuArrayDestroy),
	N(cuMipmappedArrayDestroy), N(cuCtxSetLimit), N(cuLaunch), N(cuLaunchGrid), N(cuLaunchGridAsync),
	N(cuMemFree), N(cuMemFree_v2), N(cuMemFreeAsync), N(cuMemFreeAsync_ptsz), N(cuLaunchKernel),
	N(cuLaunchKernel_ptsz), N(cuLaunchCooperativeKernel), N(cuLaunchCooperativeKernel_ptsz),
	N(cuLaunchKernelEx), N(cuLaunchKernelEx_ptsz), N(cuGraphLaunch), N(cuGraphLaunch_ptsz),
	N(cuGraphAddMemAllocNode), N(cuGraphDestroyNode), N(cuGraphDestroy), N(cuGraphClone), N(cuGraphInstantiate),
	N(cuGraphInstantiate_v2), N(cuGraphInstantiateWithFlags), N(cuGraphInstantiateWithParams),
	N(cuGraphInstantiateWithParams_ptsz), N(cuGraphExecDestroy),
};
static const struct { const char *name; void *linked; } nvml_names[] = {
	N(nvmlInit), N(nvmlInit_v2), N(nvmlInitWithFlags), N(nvmlDeviceGetMemoryInfo),
	N(nvmlDeviceGetMemoryInfo_v2), N(nvmlDeviceGetComputeRunningProcesses),
	N(nvmlDeviceGetComputeRunningProcesses_v2), N(nvmlDeviceGetComputeRunningProcesses_v3),
	N(nvmlDeviceGetGraphicsRunningProcesses), N(nvmlDeviceGetGraphicsRunningProcesses_v2),
	N(nvmlDeviceGetGraphicsRunningProcesses_v3), N(nvmlDeviceGetMPSComputeRunningProcesses),
	N(nvmlDeviceGetMPSComputeRunningProcesses_v2), N(nvmlDeviceGetMPSComputeRunningProcesses_v3),
	N(nvmlDeviceGetRunningProcessDetailList), N(nvmlDeviceGetProcessUtilization),
	N(nvmlDeviceGetProcessesUtilizationInfo), N(nvmlDeviceGetEncoderSessions), N(nvmlDeviceGetFBCSessions),
	N(nvmlDeviceGetAccountingPids), N(nvmlDeviceGetAccountingStats),
};

/* p must be libvgpu's export of exactly `name` */
static void expect_hook(const char *route, const char *name, void *p)
{
	Dl_info info;
	if (p == NULL) {
		FAIL("%s %s: not found", route, name);
		return;
	}
	if (dladdr(p, &info) == 0 || info.dli_sname == NULL || strstr(info.dli_fname, "libvgpu") == NULL ||
	    strcmp(info.dli_sname, name) != 0) {
		FAIL("%s %s: resolved to %s in %s", route, name, info.dli_sname ? info.dli_sname : "?",
		     info.dli_fname ? info.dli_fname : "?");
		return;
	}
	printf("ok %s %s\n", route, name);
}

static void *resolve(const char *route, void *handle, const char *name, void *linked)
{
	if (strcmp(route, "linked") == 0)
		return linked;
	if (strcmp(route, "dlsym") == 0)
		return dlsym(handle, name);
	if (strcmp(route, "default") == 0)
		return dlsym(RTLD_DEFAULT, name);
	if (strcmp(route, "next") == 0)
		return dlsym(RTLD_NEXT, name);
	if (strcmp(route, "oldsym") == 0)
		return old_dlsym(handle, name);
	/* a versioned lookup of a hooked name answers like dlsym */
	if (strcmp(route, "vsymdefault") == 0)
		return dlvsym(RTLD_DEFAULT, name, "CUDA_1");
	if (strcmp(route, "vsymnext") == 0)
		return dlvsym(RTLD_NEXT, name, "GLIBC_2.34");
	return NULL;
}

struct procaddr_case { const char *base; int version; int flags; const char *want; };
static const struct procaddr_case procaddr_cases[] = {
	{ "cuMemAlloc", 3000, 0, "cuMemAlloc" },
	{ "cuMemAlloc", 12000, 0, "cuMemAlloc_v2" },
	{ "cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2" },
	{ "cuDeviceTotalMem", 12000, 0, "cuDeviceTotalMem_v2" },
	{ "cuMemAllocPitch", 12000, 0, "cuMemAllocPitch_v2" },
	{ "cuMemFree", 12000, 2, "cuMemFree_v2" }, /* no per-thread variant: the legacy one */
	{ "cuMemFreeAsync", 12000, 2, "cuMemFreeAsync_ptsz" },
	{ "cuMemAllocAsync", 12000, 2, "cuMemAllocAsync_ptsz" },
	{ "cuMemAllocAsync", 12000, 1, "cuMemAllocAsync" },
	{ "cuMemAllocFromPoolAsync", 12000, 2, "cuMemAllocFromPoolAsync_ptsz" },
	{ "cuMemAllocFromPoolAsync", 12000, 0, "cuMemAllocFromPoolAsync" },
	{ "cuMemPoolCreate", 12000, 0, "cuMemPoolCreate" },
	{ "cuMemPoolDestroy", 12000, 0, "cuMemPoolDestroy" },
	{ "cuDeviceGetDefaultMemPool", 12000, 0, "cuDeviceGetDefaultMemPool" },
	{ "cuDeviceGetMemPool", 12000, 0, "cuDeviceGetMemPool" },
	{ "cuDeviceSetMemPool", 12000, 0, "cuDeviceSetMemPool" },
	{ "cuMemGetDefaultMemPool", 13000, 0, "cuMemGetDefaultMemPool" },
	{ "cuMemGetMemPool", 13000, 0, "cuMemGetMemPool" },
	{ "cuMemSetMemPool", 13000, 0, "cuMemSetMemPool" },
	{ "cuMemCreate", 12000, 0, "cuMemCreate" },
	{ "cuMemRelease", 12000, 0, "cuMemRelease" },
	{ "cuMemMap", 12000, 0, "cuMemMap" },
	{ "cuMemUnmap", 12000, 0, "cuMemUnmap" },
	{ "cuMemRetainAllocationHandle", 12000, 0, "cuMemRetainAllocationHandle" },
	{ "cuMemAllocManaged", 12000, 0, "cuMemAllocManaged" },
	{ "cuLaunchKernel", 12000, 0, "cuLaunchKernel" },
	{ "cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz" },
	{ "cuLaunchCooperativeKernel", 12000, 2, "cuLaunchCooperativeKernel_ptsz" },
	{ "cuLaunchKernelEx", 12000, 2, "cuLaunchKernelEx_ptsz" },
	{ "cuLaunchKernelEx", 12000, 0, "cuLaunchKernelEx" },
	{ "cuGraphLaunch", 12000, 2, "cuGraphLaunch_ptsz" },
	{ "cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2" },
	{ "cuGetProcAddress", 11030, 0, "cuGetProcAddress" },
	{ "cuInit", 12000, 0, "cuInit" },
	{ "cuArrayCreate", 12000, 0, "cuArrayCreate_v2" },
	{ "cuArrayCreate", 3000, 0, "cuArrayCreate" },
	{ "cuArray3DCreate", 12000, 0, "cuArray3DCreate_v2" },
	{ "cuMipmappedArrayCreate", 12000, 0, "cuMipmappedArrayCreate" },
	{ "cuArrayDestroy", 12000, 0, "cuArrayDestroy" },
	{ "cuMipmappedArrayDestroy", 12000, 0, "cuMipmappedArrayDestroy" },
	{ "cuCtxSetLimit", 12000, 0, "cuCtxSetLimit" },
	{ "cuLaunch", 12000, 0, "cuLaunch" },
	{ "cuLaunchGrid", 12000, 0, "cuLaunchGrid" },
	{ "cuLaunchGridAsync", 12000, 2, "cuLaunchGridAsync" },
	{ "cuGraphAddMemAllocNode", 12000, 0, "cuGraphAddMemAllocNode" },
	{ "cuGraphDestroyNode", 12000, 0, "cuGraphDestroyNode" },
	{ "cuGraphDestroy", 12000, 0, "cuGraphDestroy" },
	{ "cuGraphClone", 12000, 0, "cuGraphClone" },
	{ "cuGraphInstantiate", 10000, 0, "cuGraphInstantiate" },
	{ "cuGraphInstantiate", 11040, 0, "cuGraphInstantiate_v2" },
	{ "cuGraphInstantiate", 12000, 0, "cuGraphInstantiateWithFlags" }, /* three arguments from 12.0 */
	{ "cuGraphInstantiateWithFlags", 12000, 0, "cuGraphInstantiateWithFlags" },
	{ "cuGraphInstantiateWithParams", 12000, 0, "cuGraphInstantiateWithParams" },
	{ "cuGraphInstantiateWithParams", 12000, 2, "cuGraphInstantiateWithParams_ptsz" },
	{ "cuGraphExecDestroy", 12000, 0, "cuGraphExecDestroy" },
};

static void check_limit(const char *route, __typeof__(&cuMemGetInfo_v2) info, __typeof__(&cuMemAlloc_v2) alloc,
			__typeof__(&cuMemFree_v2) rfree)
{
	size_t f = 0, t = 0;
	uint64_t limit = limit_bytes();
	CUresult r = info(&f, &t);
	if (r != CUDA_SUCCESS || t != limit || f != limit)
		FAIL("%s cuMemGetInfo: r=%d free=%zu total=%zu, want %" PRIu64, route, r, f, t, limit);
	CUdeviceptr p;
	r = alloc(&p, limit + MiB);
	if (r != CUDA_ERROR_OUT_OF_MEMORY)
		FAIL("%s cuMemAlloc over the limit: %d", route, r);
	r = alloc(&p, limit);
	if (r != CUDA_SUCCESS || rfree(p) != CUDA_SUCCESS)
		FAIL("%s cuMemAlloc of the whole limit: %d", route, r);
}

static int cmd_routes(const char *route)
{
	setup();
	void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	if (cuda == NULL || nvml == NULL)
		return 6;
	if (strcmp(route, "procaddr") == 0) {
		__typeof__(&cuGetProcAddress_v2) gpa2 = dlsym(cuda, "cuGetProcAddress_v2");
		__typeof__(&cuGetProcAddress) gpa1 = dlsym(cuda, "cuGetProcAddress");
		expect_hook("procaddr", "cuGetProcAddress_v2", (void *)gpa2);
		for (size_t i = 0; i < sizeof(procaddr_cases) / sizeof(procaddr_cases[0]); i++) {
			const struct procaddr_case *c = &procaddr_cases[i];
			void *p1 = NULL, *p2 = NULL;
			CUdriverProcAddressQueryResult st = -1;
			char label[64];
			snprintf(label, sizeof(label), "procaddr(%d,%d)", c->version, c->flags);
			if (gpa2(c->base, &p2, c->version, (cuuint64_t)c->flags, &st) != CUDA_SUCCESS || st != 0)
				FAIL("cuGetProcAddress_v2(%s) failed", c->base);
			expect_hook(label, c->want, p2);
			if (gpa1(c->base, &p1, c->version, (cuuint64_t)c->flags) != CUDA_SUCCESS || p1 != p2)
				FAIL("cuGetProcAddress(%s) differs from _v2", c->base);
		}
		void *sync = NULL;
		Dl_info info;
		if (gpa2("cuCtxSynchronize", &sync, 12000, 0, NULL) != CUDA_SUCCESS || dladdr(sync, &info) == 0 ||
		    strstr(info.dli_fname, "libcuda") == NULL)
			FAIL("an unhooked name must come back from the driver untouched");
		/* the base name whose signature changed: an entry point that is no export of a hooked
		 * variant is never swapped for a hook guessed by version */
		void *inst = NULL;
		if (gpa2("cuGraphInstantiate", &inst, 12080, 0, NULL) != CUDA_SUCCESS || dladdr(inst, &info) == 0 ||
		    strstr(info.dli_fname, "libcuda") == NULL)
			FAIL("cuGraphInstantiate's internal entry point must come back from the driver untouched");
		void *info2 = NULL, *alloc2 = NULL, *free2 = NULL, *alloc1 = NULL;
		gpa2("cuMemGetInfo", &info2, 12000, 0, NULL);
		gpa2("cuMemAlloc", &alloc2, 12000, 0, NULL);
		gpa2("cuMemFree", &free2, 12000, 0, NULL);
		check_limit("procaddr", (__typeof__(&cuMemGetInfo_v2))info2, (__typeof__(&cuMemAlloc_v2))alloc2,
			    (__typeof__(&cuMemFree_v2))free2);
		gpa2("cuMemAlloc", &alloc1, 3000, 0, NULL); /* the 32-bit v1 entry point */
		CUdeviceptr_v1 p32;
		CUresult r = ((__typeof__(&cuMemAlloc))alloc1)(&p32, (unsigned)(limit_bytes() + MiB));
		if (r != CUDA_ERROR_OUT_OF_MEMORY)
			FAIL("procaddr v1 cuMemAlloc over the limit: %d", r);
	} else {
		for (size_t i = 0; i < sizeof(cuda_names) / sizeof(cuda_names[0]); i++)
			expect_hook(route, cuda_names[i].name, resolve(route, cuda, cuda_names[i].name, cuda_names[i].linked));
		for (size_t i = 0; i < sizeof(nvml_names) / sizeof(nvml_names[0]); i++)
			expect_hook(route, nvml_names[i].name, resolve(route, nvml, nvml_names[i].name, nvml_names[i].linked));
		check_limit(route, resolve(route, cuda, "cuMemGetInfo_v2", (void *)&cuMemGetInfo_v2),
			    resolve(route, cuda, "cuMemAlloc_v2", (void *)&cuMemAlloc_v2),
			    resolve(route, cuda, "cuMemFree_v2", (void *)&cuMemFree_v2));
		/* VMM allocations are limited too */
		CUmemAllocationProp prop = { .type = 1, .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
		CUmemGenericAllocationHandle h;
		__typeof__(&cuMemCreate) create = resolve(route, cuda, "cuMemCreate", (void *)&cuMemCreate);
		if (create(&h, limit_bytes() + MiB, &prop, 0) != CUDA_ERROR_OUT_OF_MEMORY)
			FAIL("%s cuMemCreate over the limit was not refused", route);
		/* a name that is not hooked resolves to the driver (by dlvsym: as glibc answers, which
		 * finds no unversioned definition by version) */
		void *sync = resolve(route, cuda, "cuCtxSynchronize", (void *)&cuCtxSynchronize);
		Dl_info info;
		int vsym = strncmp(route, "vsym", 4) == 0;
		if (vsym && sync != NULL)
			FAIL("%s cuCtxSynchronize: glibc's dlvsym finds no unversioned name, ours answered %p", route, sync);
		if (!vsym && (sync == NULL || dladdr(sync, &info) == 0 || strstr(info.dli_fname, "libcuda") == NULL))
			FAIL("%s cuCtxSynchronize must resolve to the driver", route);
		/* by version in the driver's handle: the hook where glibc finds the name, never the driver */
		void *byver = dlvsym(cuda, "cuMemAlloc_v2", "GLIBC_2.2.5");
		if (byver != NULL && byver != resolve(route, cuda, "cuMemAlloc_v2", (void *)&cuMemAlloc_v2))
			FAIL("%s dlvsym(libcuda, cuMemAlloc_v2) reached the driver", route);
	}
	printf("%s\n", failures ? "routes FAILED" : "routes ok");
	return failures ? 1 : 0;
}

static int cmd_init(void)
{
	printf("cuInit=%d\n", cuInit(0));
	printf("nvmlInit=%d\n", nvmlInit_v2());
	CUcontext ctx;
	if (cuCtxCreate_v2(&ctx, 0, 0) == CUDA_SUCCESS) {
		CUdeviceptr p;
		printf("cuMemAlloc=%d\n", cuMemAlloc_v2(&p, MiB));
		printf("cuLaunchKernel=%d\n", cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
	}
	return 0;
}

static int cmd_info(void)
{
	setup();
	size_t f, t;
	CUresult r = cuMemGetInfo_v2(&f, &t);
	printf("cuMemGetInfo=%d free=%zu total=%zu\n", r, f, t);
	size_t tm = 0;
	cuDeviceTotalMem_v2(&tm, 0);
	printf("cuDeviceTotalMem=%zu\n", tm);
	nvmlDevice_t d;
	if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(0, &d) != NVML_SUCCESS)
		return 7;
	nvmlMemory_t m;
	r = nvmlDeviceGetMemoryInfo(d, &m);
	printf("nvmlMemory=%d free=%llu total=%llu used=%llu\n", r, m.free, m.total, m.used);
	nvmlProcessInfo_t procs[64];
	unsigned n = 64;
	r = nvmlDeviceGetComputeRunningProcesses_v3(d, &n, procs);
	printf("nvmlProcesses=%d count=%u pids=", r, n);
	for (unsigned i = 0; i < n && r == 0; i++)
		printf("%u:%llu ", procs[i].pid, procs[i].usedGpuMemory);
	printf("\n");
	return 0;
}

static int cmd_busy(uint64_t mib)
{
	setup();
	CUdeviceptr p;
	if (cuMemAlloc_v2(&p, mib * MiB) != CUDA_SUCCESS)
		return 8;
	for (int first = 1;; first = 0) {
		if (cuLaunchKernel(NULL, 1000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS)
			return 8;
		if (first) {
			printf("busy\n");
			fflush(stdout);
		}
		usleep(20000);
	}
}

/* One listing asked three ways; rec: records of elem bytes, the pid pid_at bytes in. */
typedef nvmlReturn_t (*views_fn)(nvmlDevice_t, unsigned int *, void *, void *ctx);

static void show_views(const char *name, nvmlDevice_t d, views_fn fn, void *ctx, size_t elem, size_t pid_at)
{
	static unsigned char buf[64 * 64];
	unsigned int q = 0, small = 0, n = 64;
	nvmlReturn_t rq = fn(d, &q, NULL, ctx);
	nvmlReturn_t rs = fn(d, &small, buf, ctx);
	nvmlReturn_t r = fn(d, &n, buf, ctx);
	printf("%s query=%d/%u small=%d/%u list=%d/%u pids=", name, rq, q, rs, small, r, n);
	for (unsigned int i = 0; r == NVML_SUCCESS && i < n && i < 64; i++) {
		unsigned int pid;
		memcpy(&pid, buf + i * elem + pid_at, sizeof(pid));
		printf(" %u", pid);
	}
	printf(" \n");
}

#define LIST_VIEW(fn)                                                                        \
	static nvmlReturn_t view_##fn(nvmlDevice_t d, unsigned int *n, void *buf, void *ctx) \
	{                                                                                    \
		(void)ctx;                                                                   \
		return fn(d, n, buf);                                                        \
	}
LIST_VIEW(nvmlDeviceGetComputeRunningProcesses)
LIST_VIEW(nvmlDeviceGetComputeRunningProcesses_v2)
LIST_VIEW(nvmlDeviceGetComputeRunningProcesses_v3)
LIST_VIEW(nvmlDeviceGetGraphicsRunningProcesses)
LIST_VIEW(nvmlDeviceGetGraphicsRunningProcesses_v2)
LIST_VIEW(nvmlDeviceGetGraphicsRunningProcesses_v3)
LIST_VIEW(nvmlDeviceGetMPSComputeRunningProcesses)
LIST_VIEW(nvmlDeviceGetMPSComputeRunningProcesses_v2)
LIST_VIEW(nvmlDeviceGetMPSComputeRunningProcesses_v3)
LIST_VIEW(nvmlDeviceGetAccountingPids)
LIST_VIEW(nvmlDeviceGetEncoderSessions)
LIST_VIEW(nvmlDeviceGetFBCSessions)

static nvmlReturn_t view_samples(nvmlDevice_t d, unsigned int *n, void *buf, void *ctx)
{
	(void)ctx;
	return nvmlDeviceGetProcessUtilization(d, buf, n, 0);
}

static nvmlReturn_t view_util_info(nvmlDevice_t d, unsigned int *n, void *buf, void *ctx)
{
	(void)ctx;
	nvmlProcessesUtilizationInfo_t u = { .version = nvmlProcessesUtilizationInfo_v1, .processSamplesCount = *n,
					     .procUtilArray = buf };
	nvmlReturn_t r = nvmlDeviceGetProcessesUtilizationInfo(d, &u);
	*n = u.processSamplesCount;
	return r;
}

static nvmlReturn_t view_details(nvmlDevice_t d, unsigned int *n, void *buf, void *ctx)
{
	nvmlProcessDetailList_t l = { .version = nvmlProcessDetailList_v1, .mode = *(unsigned int *)ctx,
				      .numProcArrayEntries = *n, .procArray = buf };
	nvmlReturn_t r = nvmlDeviceGetRunningProcessDetailList(d, &l);
	*n = l.numProcArrayEntries;
	return r;
}

static int cmd_nvmlviews(unsigned int neighbour, int launch)
{
	setup();
	printf("pid %d\n", (int)getpid());
	CUdeviceptr p;
	if (cuMemAlloc_v2(&p, 16 * MiB) != CUDA_SUCCESS)
		return 8;
	nvmlDevice_t d;
	if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(0, &d) != NVML_SUCCESS)
		return 7;
	/* the samples first, right after the launch: they cover the last second only */
	if (launch && (cuLaunchKernel(NULL, 1000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS ||
		       cuCtxSynchronize() != CUDA_SUCCESS))
		return 8;
	show_views("samples", d, view_samples, NULL, sizeof(nvmlProcessUtilizationSample_t), 0);
	show_views("util_info", d, view_util_info, NULL, sizeof(nvmlProcessUtilizationInfo_v1_t),
		   offsetof(nvmlProcessUtilizationInfo_v1_t, pid));
	static const struct { const char *name; views_fn fn; size_t elem; } lists[] = {
		{ "compute_v1", view_nvmlDeviceGetComputeRunningProcesses, sizeof(nvmlProcessInfo_v1_t) },
		{ "compute_v2", view_nvmlDeviceGetComputeRunningProcesses_v2, sizeof(nvmlProcessInfo_t) },
		{ "compute_v3", view_nvmlDeviceGetComputeRunningProcesses_v3, sizeof(nvmlProcessInfo_t) },
		{ "graphics_v1", view_nvmlDeviceGetGraphicsRunningProcesses, sizeof(nvmlProcessInfo_v1_t) },
		{ "graphics_v2", view_nvmlDeviceGetGraphicsRunningProcesses_v2, sizeof(nvmlProcessInfo_t) },
		{ "graphics_v3", view_nvmlDeviceGetGraphicsRunningProcesses_v3, sizeof(nvmlProcessInfo_t) },
		{ "mps_v1", view_nvmlDeviceGetMPSComputeRunningProcesses, sizeof(nvmlProcessInfo_v1_t) },
		{ "mps_v2", view_nvmlDeviceGetMPSComputeRunningProcesses_v2, sizeof(nvmlProcessInfo_t) },
		{ "mps_v3", view_nvmlDeviceGetMPSComputeRunningProcesses_v3, sizeof(nvmlProcessInfo_t) },
		{ "accounting_pids", view_nvmlDeviceGetAccountingPids, sizeof(unsigned int) },
	};
	for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++)
		show_views(lists[i].name, d, lists[i].fn, NULL, lists[i].elem, 0);
	show_views("encoder_sessions", d, view_nvmlDeviceGetEncoderSessions, NULL, sizeof(nvmlEncoderSessionInfo_t),
		   offsetof(nvmlEncoderSessionInfo_t, pid));
	show_views("fbc_sessions", d, view_nvmlDeviceGetFBCSessions, NULL, sizeof(nvmlFBCSessionInfo_t),
		   offsetof(nvmlFBCSessionInfo_t, pid));
	for (unsigned int mode = 0; mode < 3; mode++) {
		char name[32];
		snprintf(name, sizeof(name), "details_mode%u", mode);
		show_views(name, d, view_details, &mode, sizeof(nvmlProcessDetail_v1_t), 0);
	}
	nvmlAccountingStats_t st;
	printf("stats_neighbour=%d\n", nvmlDeviceGetAccountingStats(d, neighbour, &st));
	/* its own host PID: the first of the compute list */
	nvmlProcessInfo_t own[64];
	unsigned int n = 64;
	nvmlReturn_t r = nvmlDeviceGetComputeRunningProcesses_v3(d, &n, own);
	printf("stats_own=%d\n", r == NVML_SUCCESS && n > 0 ? nvmlDeviceGetAccountingStats(d, own[0].pid, &st) : -1);
	return 0;
}

static int cmd_alloc(int argc, char **argv, int hold)
{
	setup();
	printf("pid %d\n", (int)getpid());
	for (int i = 0; i < argc; i++) {
		CUdeviceptr p;
		CUresult r = cuMemAlloc_v2(&p, strtoull(argv[i], NULL, 10) * MiB);
		printf("alloc %s MiB = %d\n", argv[i], r);
	}
	fflush(stdout);
	if (hold) {
		printf("held\n");
		fflush(stdout);
		for (;;)
			pause();
	}
	return 0;
}

static int cmd_fork(uint64_t parent_mib, uint64_t child_mib, uint64_t again_mib)
{
	setup();
	CUdeviceptr p;
	printf("parent alloc %" PRIu64 " MiB = %d\n", parent_mib, cuMemAlloc_v2(&p, parent_mib * MiB));
	fflush(stdout);
	pid_t kid = fork();
	if (kid == 0) {
		/* the child's context is the parent's in this fake; the driver frees at exit */
		printf("child alloc %" PRIu64 " MiB = %d\n", child_mib, cuMemAlloc_v2(&p, child_mib * MiB));
		fflush(stdout);
		_exit(0);
	}
	int st;
	if (kid < 0 || waitpid(kid, &st, 0) != kid || !WIFEXITED(st))
		return 9;
	printf("parent alloc %" PRIu64 " MiB = %d\n", again_mib, cuMemAlloc_v2(&p, again_mib * MiB));
	return 0;
}

static void wait_file(const char *dir, const char *name)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	while (access(path, F_OK) != 0)
		usleep(5000);
}

static int cmd_fill(uint64_t chunk_mib, const char *dir)
{
	setup();
	CUdeviceptr ptrs[4096];
	int n = 0;
	while (n < 4096 && cuMemAlloc_v2(&ptrs[n], chunk_mib * MiB) == CUDA_SUCCESS)
		n++;
	printf("filled %d\n", n);
	fflush(stdout);
	wait_file(dir, "free");
	int freed = 0;
	for (int i = 0; i < n; i += 2, freed++)
		if (cuMemFree_v2(ptrs[i]) != CUDA_SUCCESS)
			printf("free failed\n");
	printf("freed %d\n", freed);
	fflush(stdout);
	wait_file(dir, "refill");
	int again = 0;
	CUdeviceptr p;
	while (again < 4096 && cuMemAlloc_v2(&p, chunk_mib * MiB) == CUDA_SUCCESS)
		again++;
	printf("refilled %d\n", again);
	fflush(stdout);
	wait_file(dir, "done");
	return 0;
}

static const CUmemAllocationProp vmm_prop = { .type = 1, .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };

static int cmd_vmm(uint64_t mib, int max)
{
	setup();
	uint64_t bytes = mib * MiB;
	CUdeviceptr va[1024];
	int n = 0;
	CUresult r = CUDA_SUCCESS;
	if (max > 1024)
		max = 1024;
	while (n < max) {
		CUmemGenericAllocationHandle h;
		if ((r = cuMemAddressReserve(&va[n], bytes, 0, 0, 0)) != CUDA_SUCCESS)
			break;
		if ((r = cuMemCreate(&h, bytes, &vmm_prop, 0)) != CUDA_SUCCESS)
			break;
		if ((r = cuMemMap(va[n], bytes, 0, h, 0)) != CUDA_SUCCESS || (r = cuMemRelease(h)) != CUDA_SUCCESS)
			break;
		n++;
	}
	printf("vmm mapped %d x %" PRIu64 " MiB, then %d\n", n, mib, r);
	CUdeviceptr p;
	printf("alloc %" PRIu64 " MiB = %d\n", mib, cuMemAlloc_v2(&p, bytes));
	int unmapped = 0;
	for (int i = 0; i < n; i++)
		unmapped += cuMemUnmap(va[i], bytes) == CUDA_SUCCESS;
	printf("unmapped %d\n", unmapped);
	printf("after unmap alloc %" PRIu64 " MiB = %d\n", (uint64_t)n * mib, cuMemAlloc_v2(&p, (uint64_t)n * bytes));
	return 0;
}

static void say_alloc(const char *when, uint64_t bytes)
{
	CUdeviceptr p;
	CUresult r = cuMemAlloc_v2(&p, bytes);
	printf("%s: alloc %" PRIu64 " MiB = %d\n", when, (uint64_t)(bytes / MiB), r);
	if (r == CUDA_SUCCESS)
		cuMemFree_v2(p);
}

/* <MiB> must be more than half the limit: while it is charged, another <MiB> does not fit. */
static int cmd_vmmrefs(uint64_t mib)
{
	setup();
	uint64_t bytes = mib * MiB;
	CUdeviceptr va1, va2;
	CUmemGenericAllocationHandle h, again;
	if (cuMemAddressReserve(&va1, bytes, 0, 0, 0) != CUDA_SUCCESS || cuMemAddressReserve(&va2, bytes, 0, 0, 0) != CUDA_SUCCESS)
		return 10;
	/* retained through its mapping: two references, one mapping */
	if (cuMemCreate(&h, bytes, &vmm_prop, 0) != CUDA_SUCCESS || cuMemMap(va1, bytes, 0, h, 0) != CUDA_SUCCESS)
		return 11;
	printf("retain = %d\n", cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)va1));
	printf("release = %d\n", cuMemRelease(h));
	printf("unmap = %d\n", cuMemUnmap(va1, bytes));
	say_alloc("retained, released once, unmapped", bytes);
	printf("release retained = %d\n", cuMemRelease(again));
	say_alloc("both references released", bytes);
	/* mapped twice: released, then unmapped one at a time */
	if (cuMemCreate(&h, bytes, &vmm_prop, 0) != CUDA_SUCCESS || cuMemMap(va1, bytes, 0, h, 0) != CUDA_SUCCESS ||
	    cuMemMap(va2, bytes, 0, h, 0) != CUDA_SUCCESS || cuMemRelease(h) != CUDA_SUCCESS)
		return 12;
	printf("unmap first = %d\n", cuMemUnmap(va1, bytes));
	say_alloc("mapped twice, released, one unmapped", bytes);
	printf("unmap second = %d\n", cuMemUnmap(va2, bytes));
	say_alloc("both mappings gone", bytes);
	return 0;
}

static int cmd_asyncfree(uint64_t mib, const char *variant)
{
	setup();
	int ptsz = strcmp(variant, "ptsz") == 0;
	CUstream s = NULL;
	if (!ptsz && cuStreamCreate(&s, 0) != CUDA_SUCCESS)
		return 13;
	static volatile uint32_t go;
	if (cuStreamWaitValue32(ptsz ? CU_STREAM_PER_THREAD : s, (CUdeviceptr)(uintptr_t)&go, 1, CU_STREAM_WAIT_VALUE_GEQ) !=
	    CUDA_SUCCESS)
		return 14;
	CUdeviceptr p;
	uint64_t bytes = mib * MiB;
	CUresult r = ptsz ? cuMemAllocAsync_ptsz(&p, bytes, NULL) : cuMemAllocAsync(&p, bytes, s);
	printf("allocAsync %" PRIu64 " MiB = %d\n", mib, r);
	r = ptsz ? cuMemFreeAsync_ptsz(p, NULL) : cuMemFreeAsync(p, s);
	printf("freeAsync = %d\n", r);
	say_alloc("free queued, stream held", bytes);
	__atomic_store_n(&go, 1, __ATOMIC_RELEASE);
	say_alloc("stream let go", bytes);
	return 0;
}

/* Two GPUs, GPU 1's context current: 200 MiB and 200 MiB more through each way of allocating
 * on GPU 0 without its context (its pools, a stream of its context), freed on that stream;
 * with no context current; from a pool libvgpu never saw created (then set as GPU 0's
 * current pool); then GPU 1's own default stream, 900 MiB and 200 MiB more. */
struct pool_case { const char *name; CUmemoryPool pool; int ptsz; };

static void pool_pair(const char *name, CUmemoryPool pool, int ptsz, CUstream s)
{
	CUdeviceptr p[2];
	for (int i = 0; i < 2; i++) {
		CUresult r;
		if (pool != NULL)
			r = ptsz ? cuMemAllocFromPoolAsync_ptsz(&p[i], 200 * MiB, pool, s)
				 : cuMemAllocFromPoolAsync(&p[i], 200 * MiB, pool, s);
		else
			r = ptsz ? cuMemAllocAsync_ptsz(&p[i], 200 * MiB, s) : cuMemAllocAsync(&p[i], 200 * MiB, s);
		printf("%s %s = %d\n", name, i ? "second" : "first", r);
		if (r != CUDA_SUCCESS)
			p[i] = 0;
	}
	for (int i = 0; i < 2; i++)
		if (p[i] != 0)
			cuMemFreeAsync(p[i], s);
	cuStreamSynchronize(s);
}

static int cmd_pools(const char *via)
{
	int by_device = strcmp(via, "device") == 0;
	CUcontext ctx0, ctx1;
	CUstream s0;
	if (cuInit(0) != CUDA_SUCCESS || cuCtxCreate_v2(&ctx0, 0, 0) != CUDA_SUCCESS || cuStreamCreate(&s0, 0) != CUDA_SUCCESS)
		return 20;
	CUmemPoolProps props = { .allocType = 1, .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
	CUmemLocation gpu0 = { CU_MEM_LOCATION_TYPE_DEVICE, 0 };
	CUmemoryPool created, dflt, current, unknown, unknown2, hidden;
	void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	__typeof__(&cuMemPoolCreate) unhooked_create = (__typeof__(&cuMemPoolCreate))dlsym(drv, "fake_cuMemPoolCreate");
	__typeof__(&cuDeviceSetMemPool) unhooked_set = (__typeof__(&cuDeviceSetMemPool))dlsym(drv, "fake_cuDeviceSetMemPool");
	if (unhooked_create == NULL || unhooked_set == NULL || cuMemPoolCreate(&created, &props) != CUDA_SUCCESS ||
	    unhooked_create(&unknown, &props) != CUDA_SUCCESS || unhooked_create(&unknown2, &props) != CUDA_SUCCESS ||
	    unhooked_create(&hidden, &props) != CUDA_SUCCESS || unhooked_set(0, hidden) != CUDA_SUCCESS)
		return 21;
	/* the current pool is one libvgpu has not seen: it learns it from the getter alone */
	CUresult r = by_device ? cuDeviceGetDefaultMemPool(&dflt, 0) : cuMemGetDefaultMemPool(&dflt, &gpu0, 1);
	if (r != CUDA_SUCCESS || (by_device ? cuDeviceGetMemPool(&current, 0) : cuMemGetMemPool(&current, &gpu0, 1)) != CUDA_SUCCESS ||
	    current != hidden || unhooked_set(0, dflt) != CUDA_SUCCESS)
		return 22;
	if (cuCtxCreate_v2(&ctx1, 0, 1) != CUDA_SUCCESS)
		return 23;
	const struct pool_case cases[] = {
		{ "pool created", created, 0 }, { "pool created ptsz", created, 1 }, { "pool default", dflt, 0 },
		{ "pool current", current, 0 }, { "async stream", NULL, 0 }, { "async stream ptsz", NULL, 1 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		pool_pair(cases[i].name, cases[i].pool, cases[i].ptsz, s0);
	cuCtxSetCurrent(NULL);
	pool_pair("no context async", NULL, 0, s0);
	pool_pair("no context pool", created, 0, s0);
	cuCtxSetCurrent(ctx1);
	CUdeviceptr p;
	printf("unknown pool = %d\n", cuMemAllocFromPoolAsync(&p, MiB, unknown, s0));
	printf("set unknown pool = %d\n", by_device ? cuDeviceSetMemPool(0, unknown2) : cuMemSetMemPool(&gpu0, 1, unknown2));
	pool_pair("pool set", unknown2, 0, s0);
	pool_pair("async stream, set pool", NULL, 0, s0);
	printf("destroy = %d\n", cuMemPoolDestroy(created));
	CUdeviceptr q[2];
	for (int i = 0; i < 2; i++)
		printf("gpu 1 default stream %s = %d\n", i ? "200 MiB" : "900 MiB",
		       cuMemAllocAsync(&q[i], (i ? 200 : 900) * MiB, NULL));
	(void)ctx0;
	return 0;
}

/* The array variants. big: far over a 256 MiB limit; half: 128 MiB (mipmapped: about 85 MiB, the
 * levels of 4096 x 4096 floats summed), so that a 200 MiB allocation does not fit beside it. */
static CUresult array_create(const char *v, int big, uint64_t *key)
{
	unsigned w = big ? 8192 : 4096;
	if (strcmp(v, "2d") == 0) {
		CUDA_ARRAY_DESCRIPTOR d = { w, big ? 8192 : 2048, CU_AD_FORMAT_FLOAT, 4 };
		return cuArrayCreate_v2((CUarray *)key, &d);
	}
	if (strcmp(v, "2d_v1") == 0) {
		CUDA_ARRAY_DESCRIPTOR_v1 d = { w, big ? 8192 : 2048, CU_AD_FORMAT_UNSIGNED_INT32, 4 };
		return cuArrayCreate((CUarray *)key, &d);
	}
	if (strcmp(v, "3d") == 0) {
		CUDA_ARRAY3D_DESCRIPTOR d = { 512, 512, big ? 4096 : 128, CU_AD_FORMAT_FLOAT, 1, 0 };
		return cuArray3DCreate_v2((CUarray *)key, &d);
	}
	if (strcmp(v, "3d_v1") == 0) {
		CUDA_ARRAY3D_DESCRIPTOR_v1 d = { 512, 512, big ? 2048 : 64, CU_AD_FORMAT_HALF, 4, 0 };
		return cuArray3DCreate((CUarray *)key, &d);
	}
	CUDA_ARRAY3D_DESCRIPTOR d = { w, w, 0, CU_AD_FORMAT_FLOAT, big ? 4 : 1, 0 };
	return cuMipmappedArrayCreate((CUmipmappedArray *)key, &d, 13);
}

static int cmd_arrays(void)
{
	static const char *const variants[] = { "2d", "2d_v1", "3d", "3d_v1", "mipmapped" };
	setup();
	for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
		const char *v = variants[i];
		uint64_t key = 0;
		char when[64];
		printf("%s over the limit = %d\n", v, array_create(v, 1, &key));
		CUresult r = array_create(v, 0, &key);
		printf("%s half = %d\n", v, r);
		snprintf(when, sizeof(when), "%s held", v);
		say_alloc(when, 200 * MiB);
		if (r == CUDA_SUCCESS)
			printf("%s destroy = %d\n", v,
			       strcmp(v, "mipmapped") == 0 ? cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)key)
							   : cuArrayDestroy((CUarray)(uintptr_t)key));
		snprintf(when, sizeof(when), "%s destroyed", v);
		say_alloc(when, 200 * MiB);
	}
	return 0;
}

CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);

static CUresult graph_node(CUgraph g, uint64_t bytes, CUgraphNode *node)
{
	CUDA_MEM_ALLOC_NODE_PARAMS p;
	memset(&p, 0, sizeof(p));
	p.poolProps.allocType = 1; /* pinned */
	p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.poolProps.location.id = 0;
	p.bytesize = bytes;
	return cuGraphAddMemAllocNode(node, g, NULL, 0, &p);
}

static CUgraph graph_of(uint64_t bytes)
{
	CUgraph g = NULL;
	CUgraphNode n;
	if (cuGraphCreate(&g, 0) != CUDA_SUCCESS || (bytes != 0 && graph_node(g, bytes, &n) != CUDA_SUCCESS))
		exit(7);
	return g;
}

static CUresult graph_instantiate(const char *via, CUgraphExec *exec, CUgraph g)
{
	CUDA_GRAPH_INSTANTIATE_PARAMS params = { 0, NULL, NULL, 0 };
	void *fn = NULL;
	if (strcmp(via, "plain") == 0)
		return cuGraphInstantiate(exec, g, NULL, NULL, 0);
	if (strcmp(via, "v2") == 0)
		return cuGraphInstantiate_v2(exec, g, NULL, NULL, 0);
	if (strcmp(via, "flags") == 0)
		return cuGraphInstantiateWithFlags(exec, g, 0);
	if (strcmp(via, "params") == 0)
		return cuGraphInstantiateWithParams(exec, g, &params);
	if (strcmp(via, "params_ptsz") == 0)
		return cuGraphInstantiateWithParams_ptsz(exec, g, &params);
	if (strcmp(via, "procaddr11") == 0) {
		if (cuGetProcAddress_v2("cuGraphInstantiate", &fn, 11040, 0, NULL) != CUDA_SUCCESS)
			return CUDA_ERROR_NOT_FOUND;
		return ((__typeof__(&cuGraphInstantiate_v2))fn)(exec, g, NULL, NULL, 0);
	}
	if (cuGetProcAddress_v2("cuGraphInstantiate", &fn, 12000, 0, NULL) != CUDA_SUCCESS) /* procaddr12 */
		return CUDA_ERROR_NOT_FOUND;
	return ((__typeof__(&cuGraphInstantiateWithFlags))fn)(exec, g, 0);
}

static int cmd_graphs(void)
{
	static const char *const vias[] = { "plain", "v2", "flags", "params", "params_ptsz", "procaddr11", "procaddr12" };
	setup();
	for (size_t i = 0; i < sizeof(vias) / sizeof(vias[0]); i++) {
		const char *v = vias[i];
		char when[64];
		CUgraphExec e;
		CUgraph g = graph_of(300 * MiB);
		CUresult r = graph_instantiate(v, &e, g);
		printf("%s over the limit = %d\n", v, r);
		if (r == CUDA_SUCCESS)
			cuGraphExecDestroy(e);
		cuGraphDestroy(g);
		g = graph_of(200 * MiB);
		r = graph_instantiate(v, &e, g);
		printf("%s half = %d\n", v, r);
		snprintf(when, sizeof(when), "%s held", v);
		say_alloc(when, 200 * MiB);
		if (r == CUDA_SUCCESS)
			printf("%s exec destroy = %d\n", v, cuGraphExecDestroy(e));
		snprintf(when, sizeof(when), "%s destroyed", v);
		say_alloc(when, 200 * MiB);
		cuGraphDestroy(g);
	}

	/* a destroyed node: its graph holds nothing */
	CUgraphExec e;
	CUgraphNode n, cn;
	CUgraph g = graph_of(0), c;
	graph_node(g, 300 * MiB, &n);
	printf("node destroy = %d\n", cuGraphDestroyNode(n));
	CUresult r = cuGraphInstantiateWithFlags(&e, g, 0);
	printf("node destroyed: instantiate = %d\n", r);
	if (r == CUDA_SUCCESS)
		cuGraphExecDestroy(e);
	cuGraphDestroy(g);

	/* a destroyed graph: the next graph, which gets its handle again, holds nothing */
	g = graph_of(300 * MiB);
	cuGraphDestroy(g);
	CUgraph again = graph_of(0);
	printf("graph handle reused = %d\n", again == g);
	r = cuGraphInstantiateWithFlags(&e, again, 0);
	printf("graph destroyed: instantiate = %d\n", r);
	if (r == CUDA_SUCCESS)
		cuGraphExecDestroy(e);
	cuGraphDestroy(again);

	/* a clone carries its nodes, outliving the original; its node destroyed, nothing */
	g = graph_of(0);
	graph_node(g, 300 * MiB, &n);
	printf("clone = %d\n", cuGraphClone(&c, g));
	printf("find in clone = %d\n", cuGraphNodeFindInClone(&cn, n, c));
	cuGraphDestroy(g);
	r = cuGraphInstantiateWithFlags(&e, c, 0);
	printf("clone over the limit = %d\n", r);
	if (r == CUDA_SUCCESS)
		cuGraphExecDestroy(e);
	printf("clone node destroy = %d\n", cuGraphDestroyNode(cn));
	r = cuGraphInstantiateWithFlags(&e, c, 0);
	printf("clone node destroyed: instantiate = %d\n", r);
	if (r == CUDA_SUCCESS)
		cuGraphExecDestroy(e);
	cuGraphDestroy(c);
	g = graph_of(200 * MiB);
	cuGraphClone(&c, g);
	cuGraphDestroy(g);
	r = cuGraphInstantiateWithFlags(&e, c, 0);
	printf("clone half = %d\n", r);
	say_alloc("clone held", 200 * MiB);
	if (r == CUDA_SUCCESS)
		cuGraphExecDestroy(e);
	say_alloc("clone destroyed", 200 * MiB);
	cuGraphDestroy(c);
	return 0;
}

/* 256 MiB limit, a device of 16 x 2048 resident threads: 1 KiB of stack is 32 MiB. */
static int cmd_limits(void)
{
	static const struct { const char *name; CUlimit limit; size_t value; } steps[] = {
		{ "heap 512 MiB", CU_LIMIT_MALLOC_HEAP_SIZE, 512 * MiB },
		{ "heap 128 MiB", CU_LIMIT_MALLOC_HEAP_SIZE, 128 * MiB },
		{ "heap 16 MiB", CU_LIMIT_MALLOC_HEAP_SIZE, 16 * MiB },
		{ "stack 16 KiB", CU_LIMIT_STACK_SIZE, 16384 },
		{ "stack 4 KiB", CU_LIMIT_STACK_SIZE, 4096 },
		{ "stack 1 KiB", CU_LIMIT_STACK_SIZE, 1024 },
	};
	setup();
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		printf("set %s = %d\n", steps[i].name, cuCtxSetLimit(steps[i].limit, steps[i].value));
		say_alloc(steps[i].name, 200 * MiB);
	}
	return 0;
}

/* Modules and libraries whose globals take 200 MiB, loaded by each entry point while 16 MiB
 * are held (the reconciliation ran at that allocation): while one is loaded 200 MiB more do not
 * fit a 256 MiB limit, once it is unloaded they do. */
static int cmd_modules(void)
{
	static const char *const vias[] = { "data", "dataex", "fatbinary", "file", "library", "libraryfile" };
	struct fake_module_image image = { FAKE_MODULE_MAGIC, 200 * MiB };
	char path[] = "/tmp/vgpu_probe_module.XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0 || write(fd, &image, sizeof(image)) != (ssize_t)sizeof(image) || close(fd) != 0)
		return 6;
	setup();
	CUdeviceptr held;
	printf("alloc 16 MiB = %d\n", cuMemAlloc_v2(&held, 16 * MiB));
	for (size_t i = 0; i < sizeof(vias) / sizeof(vias[0]); i++) {
		const char *v = vias[i];
		CUmodule mod = NULL;
		CUlibrary lib = NULL;
		CUresult r;
		if (strcmp(v, "data") == 0)
			r = cuModuleLoadData(&mod, &image);
		else if (strcmp(v, "dataex") == 0)
			r = cuModuleLoadDataEx(&mod, &image, 0, NULL, NULL);
		else if (strcmp(v, "fatbinary") == 0)
			r = cuModuleLoadFatBinary(&mod, &image);
		else if (strcmp(v, "file") == 0)
			r = cuModuleLoad(&mod, path);
		else if (strcmp(v, "library") == 0)
			r = cuLibraryLoadData(&lib, &image, NULL, NULL, 0, NULL, NULL, 0);
		else
			r = cuLibraryLoadFromFile(&lib, path, NULL, NULL, 0, NULL, NULL, 0);
		printf("%s load = %d\n", v, r);
		char when[64];
		snprintf(when, sizeof(when), "%s loaded", v);
		say_alloc(when, 200 * MiB);
		printf("%s unload = %d\n", v, lib ? cuLibraryUnload(lib) : cuModuleUnload(mod));
		snprintf(when, sizeof(when), "%s unloaded", v);
		say_alloc(when, 200 * MiB);
	}
	unlink(path);
	return 0;
}

static int cmd_stdin(void)
{
	setup();
	CUdeviceptr p;
	printf("alloc = %d\n", cuMemAlloc_v2(&p, MiB));
	char line[128];
	printf("stdin: %s", fgets(line, sizeof(line), stdin) ? line : "(nothing)\n");
	return 0;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmd_launch(double seconds, unsigned blocks, const char *via)
{
	setup();
	double start = now_s();
	unsigned long launches = 0;
	while (now_s() - start < seconds) {
		CUresult r;
		if (strcmp(via, "grid") == 0)
			r = cuLaunchGrid(NULL, (int)blocks, 1);
		else if (strcmp(via, "gridasync") == 0)
			r = cuLaunchGridAsync(NULL, (int)blocks, 1, NULL);
		else if (strcmp(via, "legacy") == 0)
			r = cuLaunch(NULL);
		else
			r = cuLaunchKernel(NULL, blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
		if (r != CUDA_SUCCESS)
			return 8;
		launches++;
	}
	cuCtxSynchronize();
	printf("launches=%lu elapsed=%.3f\n", launches, now_s() - start);
	return 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };
	while (nanosleep(&ts, &ts) != 0)
		;
}

static int launch_one(void)
{
	return cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS ? 0 : -1;
}

/* "missing", or whether the file was written since its modification time was set to 0 */
static const char *wake_state(const char *path)
{
	struct stat st;
	if (stat(path, &st) != 0)
		return "missing";
	return st.st_mtim.tv_sec == 0 && st.st_mtim.tv_nsec == 0 ? "unwritten" : "written";
}

static void wake_reset(const char *path)
{
	const struct timespec zero[2] = { { 0, 0 }, { 0, 0 } };
	if (utimensat(AT_FDCWD, path, zero, 0) != 0 && errno != ENOENT)
		perror(path);
}

static int cmd_wake(const char *root)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/tmp/.vgpu_lock/" VGPU_CORE_WAKE_NAME, root);
	setup();
	CUgraph g;
	CUgraphExec idle_graph;
	if (cuGraphCreate(&g, 0) != CUDA_SUCCESS || cuGraphInstantiateWithFlags(&idle_graph, g, 0) != CUDA_SUCCESS)
		return 9;
	uint64_t prev = now_ns();
	if (launch_one() != 0)
		return 8;
	struct stat st;
	printf("first %s size=%lld\n", wake_state(path), stat(path, &st) == 0 ? (long long)st.st_size : -1ll);
	/* Back to back, no launch is a wake. A launch whose gap to the one before (as the library can
	 * see it: from the start of one to the end of the next) reached VGPU_WAKE_IDLE_NS, a stall of
	 * this process, may be one: such a round does not count, and another is run. */
	for (int round = 0; round < 10; round++) {
		wake_reset(path);
		uint64_t max_gap = 0;
		for (int i = 0; i < 200; i++) {
			uint64_t start = now_ns();
			if (launch_one() != 0)
				return 8;
			uint64_t gap = now_ns() - prev;
			max_gap = gap > max_gap ? gap : max_gap;
			prev = start;
		}
		if (max_gap < VGPU_WAKE_IDLE_NS) {
			printf("burst %s\n", wake_state(path));
			break;
		}
		printf("burst round %d stalled %llu ms (not counted)\n", round, (unsigned long long)(max_gap / 1000000));
	}
	wake_reset(path);
	sleep_ns(2 * VGPU_WAKE_IDLE_NS);
	printf("idle-graph %s\n", cuGraphLaunch(idle_graph, NULL) == CUDA_SUCCESS ? wake_state(path) : "failed");
	return 0;
}

static struct core_file *map_core_file(const char *root)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/tmp/.vgpu_lock/core.v3", root);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return NULL;
	void *p = mmap(NULL, sizeof(struct core_file), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? NULL : p;
}

static int write_allowance(const char *root, const char *uuid, int pct)
{
	char tmp[512], path[512], text[256];
	snprintf(tmp, sizeof(tmp), "%s/etc/vgpu-dra/config/.allowance.tmp", root);
	snprintf(path, sizeof(path), "%s/etc/vgpu-dra/config/cores.allowance", root);
	int len = snprintf(text, sizeof(text), "version 1\ngpu %s %d\n", uuid, pct);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || write(fd, text, (size_t)len) != len || close(fd) != 0 || rename(tmp, path) != 0)
		return -1; /* as the node writes it: a new file renamed into place */
	return 0;
}

static int cmd_follow(const char *root, const char *uuid, int pct)
{
	setup();
	if (launch_one() != 0)
		return 8;
	struct core_file *f = map_core_file(root);
	if (f == NULL)
		return 9;
	uint64_t control = atomic_load(&f->bucket[0].next_control_ns);
	printf("before rate=%llu target=%u\n", (unsigned long long)atomic_load(&f->bucket[0].rate),
	       (unsigned)atomic_load(&f->rate_target[0]));
	if (write_allowance(root, uuid, pct) != 0)
		return 10;
	sleep_ns(VGPU_ALLOWANCE_CHECK_NS + 1000000);
	if (launch_one() != 0)
		return 8;
	printf("after rate=%llu target=%u control-step-between=%d\n", (unsigned long long)atomic_load(&f->bucket[0].rate),
	       (unsigned)atomic_load(&f->rate_target[0]), atomic_load(&f->bucket[0].next_control_ns) != control);
	return 0;
}

CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
			      const CUDA_KERNEL_NODE_PARAMS *params);
CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
				  CUgraph child);

/* A graph of <nodes> kernel nodes of <blocks> blocks each (child: held by a parent graph as
 * its child graph node, beside one kernel of one block), instantiated, then launched
 * <launches> times back to back. Prints the launches' wall time. */
static int cmd_graphlaunch(unsigned long nodes, unsigned blocks, int launches, const char *shape)
{
	setup();
	CUgraph g, parent;
	CUgraphNode n;
	CUDA_KERNEL_NODE_PARAMS k = { 0 };
	k.gridDimX = blocks;
	k.gridDimY = k.gridDimZ = 1;
	k.blockDimX = 128;
	k.blockDimY = k.blockDimZ = 1;
	if (cuGraphCreate(&g, 0) != CUDA_SUCCESS)
		return 7;
	for (unsigned long i = 0; i < nodes; i++)
		if (cuGraphAddKernelNode(&n, g, NULL, 0, &k) != CUDA_SUCCESS)
			return 7;
	if (strcmp(shape, "child") == 0) {
		k.gridDimX = 1;
		if (cuGraphCreate(&parent, 0) != CUDA_SUCCESS || cuGraphAddKernelNode(&n, parent, NULL, 0, &k) != CUDA_SUCCESS ||
		    cuGraphAddChildGraphNode(&n, parent, NULL, 0, g) != CUDA_SUCCESS || cuGraphDestroy(g) != CUDA_SUCCESS)
			return 7;
		g = parent; /* the child node holds a copy of the graph */
	}
	CUgraphExec e;
	CUresult r = cuGraphInstantiateWithFlags(&e, g, 0);
	printf("instantiate = %d\n", r);
	if (r != CUDA_SUCCESS)
		return 7;
	double start = now_s();
	for (int i = 0; i < launches; i++) {
		r = i % 2 ? cuGraphLaunch_ptsz(e, NULL) : cuGraphLaunch(e, NULL);
		if (r != CUDA_SUCCESS)
			return 8;
	}
	cuCtxSynchronize();
	printf("graph launches=%d elapsed=%.3f\n", launches, now_s() - start);
	printf("exec destroy = %d\n", cuGraphExecDestroy(e));
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && strcmp(argv[1], "routes") == 0)
		return cmd_routes(argv[2]);
	if (argc >= 2 && strcmp(argv[1], "init") == 0)
		return cmd_init();
	if (argc >= 2 && strcmp(argv[1], "info") == 0)
		return cmd_info();
	if (argc >= 3 && strcmp(argv[1], "alloc") == 0)
		return cmd_alloc(argc - 2, argv + 2, 0);
	if (argc >= 3 && strcmp(argv[1], "hold") == 0)
		return cmd_alloc(argc - 2, argv + 2, 1);
	if (argc >= 3 && strcmp(argv[1], "busy") == 0)
		return cmd_busy(strtoull(argv[2], NULL, 10));
	if (argc >= 4 && strcmp(argv[1], "nvmlviews") == 0)
		return cmd_nvmlviews((unsigned int)strtoul(argv[2], NULL, 10), atoi(argv[3]));
	if (argc >= 4 && strcmp(argv[1], "vmm") == 0)
		return cmd_vmm(strtoull(argv[2], NULL, 10), atoi(argv[3]));
	if (argc >= 3 && strcmp(argv[1], "vmmrefs") == 0)
		return cmd_vmmrefs(strtoull(argv[2], NULL, 10));
	if (argc >= 4 && strcmp(argv[1], "asyncfree") == 0)
		return cmd_asyncfree(strtoull(argv[2], NULL, 10), argv[3]);
	if (argc >= 2 && strcmp(argv[1], "stdin") == 0)
		return cmd_stdin();
	if (argc >= 3 && strcmp(argv[1], "pools") == 0)
		return cmd_pools(argv[2]);
	if (argc >= 5 && strcmp(argv[1], "fork") == 0)
		return cmd_fork(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
	if (argc >= 4 && strcmp(argv[1], "fill") == 0)
		return cmd_fill(strtoull(argv[2], NULL, 10), argv[3]);
	if (argc >= 4 && strcmp(argv[1], "launch") == 0)
		return cmd_launch(atof(argv[2]), (unsigned)atoi(argv[3]), argc >= 5 ? argv[4] : "kernel");
	if (argc >= 6 && strcmp(argv[1], "graphlaunch") == 0)
		return cmd_graphlaunch(strtoul(argv[2], NULL, 10), (unsigned)atoi(argv[3]), atoi(argv[4]), argv[5]);
	if (argc >= 2 && strcmp(argv[1], "arrays") == 0)
		return cmd_arrays();
	if (argc >= 2 && strcmp(argv[1], "limits") == 0)
		return cmd_limits();
	if (argc >= 2 && strcmp(argv[1], "modules") == 0)
		return cmd_modules();
	if (argc >= 2 && strcmp(argv[1], "graphs") == 0)
		return cmd_graphs();
	if (argc >= 3 && strcmp(argv[1], "wake") == 0)
		return cmd_wake(argv[2]);
	if (argc >= 5 && strcmp(argv[1], "follow") == 0)
		return cmd_follow(argv[2], argv[3], atoi(argv[4]));
	fprintf(stderr, "usage: vgpu_probe routes|init|info|alloc|hold|busy|nvmlviews|fork|fill|launch|graphlaunch|arrays|graphs|limits|wake|follow|vmm|vmmrefs|asyncfree|pools|stdin ...\n");
	return 2;
}
