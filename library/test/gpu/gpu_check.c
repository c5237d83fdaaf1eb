/* Checks on a real NVIDIA GPU (hack/gpu-check.sh), no nvcc: kernels are PTX text JIT-compiled
 * by the driver. The driver is reached by dlopen + dlsym, i.e. through libvgpu's dlsym route
 * when it is preloaded. Commands:
 *   info <limit MiB>          memory info, allocation over / within the limit, NVML view
 *   launch <n>                ns per cuLaunchKernel of an empty kernel (asynchronous)
 *   alloc <n>                 ns per cuMemAlloc + cuMemFree pair of 1 MiB
 *   spin <seconds> <cycles>   launch a spinning kernel back to back; prints kernels/s
 *   context <unused>          what the driver charges this process with a context and a loaded
 *                             module and no allocation, as NVML reports it: the node-side
 *                             enforcer's slack per process (contract §15)
 *   counts <limit MiB>        a CUDA array (cudaMallocArray's driver call), the device heap and
 *                             stack (cuCtxSetLimit) against the limit: over it refused, within
 *                             it charged until destroyed or lowered (contract §9)
 *   vmm <limit MiB>           the Programming Guide's virtual memory loop (create, map, release at
 *                             once) until refused: what stays mapped is within the limit
 *   graphmem <limit MiB>      a graph with a memory allocation node: over the limit its
 *                             instantiation is refused, within it charged until the executable
 *                             is destroyed
 *   module <limit MiB>        a PTX module with a __device__ array of limit/2: while loaded,
 *                             limit/2 more does not fit; unloaded, it does
 *   bypass <MiB> <seconds>    a tenant around the library (threat-model.md, "dlvsym-libc-dlsym"):
 *                             libc's own dlsym through dlvsym, the driver's cuMemAlloc_v2 from
 *                             it, MiB allocated past any limit and held; prints bypass_alloc=<rc>
 *                             and then sleeps, for the node-side enforcer to kill */
#include <unistd.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../src/cuda_api.h"
#include "../../src/nvml_api.h"

static const char ptx[] =
	".version 6.0\n.target sm_50\n.address_size 64\n"
	".visible .entry empty()\n{\n\tret;\n}\n"
	".visible .entry spin(.param .u64 cycles)\n{\n"
	"\t.reg .u64 %rd<5>;\n\t.reg .pred %p;\n"
	"\tld.param.u64 %rd1, [cycles];\n\tmov.u64 %rd2, %clock64;\n"
	"L:\n\tmov.u64 %rd3, %clock64;\n\tsub.u64 %rd4, %rd3, %rd2;\n"
	"\tsetp.lt.u64 %p, %rd4, %rd1;\n\t@%p bra L;\n\tret;\n}\n";

static void *cuda, *nvml;
#define SYM(lib, name) ((name##_t *)need(lib, #name))
static void *need(void *lib, const char *name)
{
	void *p = dlsym(lib, name);
	if (p == NULL) {
		fprintf(stderr, "gpu_check: %s not found\n", name);
		exit(2);
	}
	return p;
}

/* function types, from the public driver API documentation */
typedef CUresult cuInit_t(unsigned);
typedef CUresult cuCtxCreate_v2_t(CUcontext *, unsigned, CUdevice);
typedef CUresult cuCtxSynchronize_t(void);
typedef CUresult cuMemGetInfo_v2_t(size_t *, size_t *);
typedef CUresult cuMemAlloc_v2_t(CUdeviceptr *, size_t);
typedef CUresult cuMemFree_v2_t(CUdeviceptr);
typedef CUresult cuModuleLoadData_t(CUmodule *, const void *);
typedef CUresult cuModuleGetFunction_t(CUfunction *, CUmodule, const char *);
typedef CUresult cuLaunchKernel_t(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				  CUstream, void **, void **);
typedef CUresult cuArrayCreate_v2_t(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef CUresult cuArrayDestroy_t(CUarray);
typedef CUresult cuCtxSetLimit_t(CUlimit, size_t);
typedef CUresult cuModuleUnload_t(CUmodule);
typedef CUresult cuModuleGetGlobal_v2_t(CUdeviceptr *, size_t *, CUmodule, const char *);
typedef CUresult cuMemAddressReserve_t(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult cuMemAddressFree_t(CUdeviceptr, size_t);
typedef CUresult cuMemCreate_t(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult cuMemMap_t(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult cuMemUnmap_t(CUdeviceptr, size_t);
typedef CUresult cuMemRelease_t(CUmemGenericAllocationHandle);
typedef CUresult cuGraphCreate_t(CUgraph *, unsigned);
typedef CUresult cuGraphAddMemAllocNode_t(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
					  CUDA_MEM_ALLOC_NODE_PARAMS *);
typedef CUresult cuGraphInstantiateWithFlags_t(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult cuGraphExecDestroy_t(CUgraphExec);
typedef CUresult cuGraphDestroy_t(CUgraph);
typedef nvmlReturn_t nvmlInit_v2_t(void);
typedef nvmlReturn_t nvmlDeviceGetHandleByIndex_v2_t(unsigned, nvmlDevice_t *);
typedef nvmlReturn_t nvmlDeviceGetMemoryInfo_t(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3_t(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static CUfunction kernel(const char *name)
{
	CUmodule m;
	CUfunction f;
	if (SYM(cuda, cuModuleLoadData)(&m, ptx) != CUDA_SUCCESS ||
	    SYM(cuda, cuModuleGetFunction)(&f, m, name) != CUDA_SUCCESS) {
		fprintf(stderr, "gpu_check: cannot load the PTX kernel %s\n", name);
		exit(3);
	}
	return f;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	cuda = dlopen("libcuda.so.1", RTLD_NOW);
	if (cuda == NULL) {
		fprintf(stderr, "gpu_check: libcuda.so.1: %s\n", dlerror());
		return 2;
	}
	CUresult r = SYM(cuda, cuInit)(0);
	printf("cuInit=%d\n", r);
	if (r != CUDA_SUCCESS)
		return 0;
	CUcontext ctx;
	if (SYM(cuda, cuCtxCreate_v2)(&ctx, 0, 0) != CUDA_SUCCESS)
		return 3;
	const double MiB = 1024.0 * 1024.0;
	if (strcmp(argv[1], "info") == 0) {
		size_t limit = (size_t)strtoull(argv[2], NULL, 10) << 20, f, t;
		SYM(cuda, cuMemGetInfo_v2)(&f, &t);
		printf("cuMemGetInfo: free %.0f MiB total %.0f MiB\n", f / MiB, t / MiB);
		CUdeviceptr p;
		printf("alloc limit+1MiB: %d (want 2)\n", SYM(cuda, cuMemAlloc_v2)(&p, limit + (1 << 20)));
		r = SYM(cuda, cuMemAlloc_v2)(&p, limit / 2);
		printf("alloc limit/2: %d (want 0)\n", r);
		SYM(cuda, cuMemGetInfo_v2)(&f, &t);
		printf("cuMemGetInfo after: free %.0f MiB total %.0f MiB (context memory counted via NVML)\n", f / MiB,
		       t / MiB);
		nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
		nvmlDevice_t d;
		nvmlMemory_t m;
		if (nvml && SYM(nvml, nvmlInit_v2)() == 0 && SYM(nvml, nvmlDeviceGetHandleByIndex_v2)(0, &d) == 0 &&
		    SYM(nvml, nvmlDeviceGetMemoryInfo)(d, &m) == 0)
			printf("nvmlDeviceGetMemoryInfo: total %.0f MiB used %.0f MiB\n", m.total / MiB, m.used / MiB);
	} else if (strcmp(argv[1], "launch") == 0) {
		long n = atol(argv[2]);
		CUfunction f = kernel("empty");
		cuLaunchKernel_t *launch = SYM(cuda, cuLaunchKernel);
		double best = 1e30;
		for (int rep = 0; rep < 5; rep++) {
			double t0 = now_ns();
			for (long i = 0; i < n; i++)
				if (launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS)
					return 4;
			double per = (now_ns() - t0) / (double)n;
			SYM(cuda, cuCtxSynchronize)();
			if (per < best)
				best = per;
		}
		printf("launch_ns=%.1f\n", best);
	} else if (strcmp(argv[1], "alloc") == 0) {
		long n = atol(argv[2]);
		double t0 = now_ns();
		for (long i = 0; i < n; i++) {
			CUdeviceptr p;
			if (SYM(cuda, cuMemAlloc_v2)(&p, 1 << 20) != CUDA_SUCCESS || SYM(cuda, cuMemFree_v2)(p) != CUDA_SUCCESS)
				return 5;
		}
		printf("alloc_pair_ns=%.1f\n", (now_ns() - t0) / (double)n);
	} else if (strcmp(argv[1], "context") == 0) {
		(void)kernel("spin"); /* a loaded module, as every real program has */
		SYM(cuda, cuCtxSynchronize)();
		nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
		nvmlDevice_t d;
		nvmlProcessInfo_t procs[256];
		unsigned n = 256;
		if (nvml == NULL || SYM(nvml, nvmlInit_v2)() != 0 || SYM(nvml, nvmlDeviceGetHandleByIndex_v2)(0, &d) != 0 ||
		    SYM(nvml, nvmlDeviceGetComputeRunningProcesses_v3)(d, &n, procs) != 0)
			return 7;
		for (unsigned i = 0; i < n; i++)
			if (procs[i].pid == (unsigned)getpid())
				printf("context_bytes=%llu\n", procs[i].usedGpuMemory);
	} else if (strcmp(argv[1], "counts") == 0) {
		size_t limit = (size_t)strtoull(argv[2], NULL, 10) << 20;
		cuMemAlloc_v2_t *alloc = SYM(cuda, cuMemAlloc_v2);
		cuMemFree_v2_t *release = SYM(cuda, cuMemFree_v2);
		CUdeviceptr p;
#define TRY_ALLOC(what, bytes)                                                          \
	do {                                                                            \
		CUresult ar = alloc(&p, bytes);                                         \
		printf("%s: alloc %.0f MiB = %d\n", what, (double)(bytes) / MiB, ar); \
		if (ar == CUDA_SUCCESS)                                                 \
			release(p);                                                     \
	} while (0)
		/* float4 rows: 16 bytes an element; limit/2 is 8192 x limit/(2 x 131072) */
		CUDA_ARRAY_DESCRIPTOR big = { 16384, 16384, CU_AD_FORMAT_FLOAT, 4 };
		CUDA_ARRAY_DESCRIPTOR half = { 8192, limit / 2 / (8192 * 16), CU_AD_FORMAT_FLOAT, 4 };
		CUarray a;
		printf("array over the limit = %d (want 2)\n", SYM(cuda, cuArrayCreate_v2)(&a, &big));
		r = SYM(cuda, cuArrayCreate_v2)(&a, &half);
		printf("array of limit/2 = %d (want 0)\n", r);
		TRY_ALLOC("array held", limit / 2 + (1 << 20));
		if (r == CUDA_SUCCESS)
			printf("array destroy = %d\n", SYM(cuda, cuArrayDestroy)(a));
		TRY_ALLOC("array destroyed", limit / 4);
		cuCtxSetLimit_t *set = SYM(cuda, cuCtxSetLimit);
		printf("heap 2 x limit = %d (want 2)\n", set(CU_LIMIT_MALLOC_HEAP_SIZE, 2 * limit));
		printf("heap limit/2 = %d (want 0)\n", set(CU_LIMIT_MALLOC_HEAP_SIZE, limit / 2));
		TRY_ALLOC("heap limit/2", limit / 2 + (1 << 20));
		printf("heap 1 MiB = %d (want 0)\n", set(CU_LIMIT_MALLOC_HEAP_SIZE, 1 << 20));
		TRY_ALLOC("heap 1 MiB", limit / 4);
		printf("stack 64 KiB = %d (want 2)\n", set(CU_LIMIT_STACK_SIZE, 64 << 10)); /* x every resident thread */
		printf("stack 1 KiB = %d (want 0)\n", set(CU_LIMIT_STACK_SIZE, 1 << 10));
		TRY_ALLOC("stack 1 KiB", limit / 4);
	} else if (strcmp(argv[1], "vmm") == 0) {
		/* 2 MiB is every current GPU's VMM granularity; limit/8 per step */
		size_t limit = (size_t)strtoull(argv[2], NULL, 10) << 20, step = (limit / 8 + (2 << 20) - 1) & ~(size_t)((2 << 20) - 1);
		CUmemAllocationProp prop = { .type = 1, .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
		size_t mapped = 0;
		CUdeviceptr va[64];
		int n = 0;
		for (; n < 64; n++) {
			CUmemGenericAllocationHandle h;
			if (SYM(cuda, cuMemAddressReserve)(&va[n], step, 0, 0, 0) != CUDA_SUCCESS)
				break;
			r = SYM(cuda, cuMemCreate)(&h, step, &prop, 0);
			if (r != CUDA_SUCCESS) {
				SYM(cuda, cuMemAddressFree)(va[n], step);
				break;
			}
			if (SYM(cuda, cuMemMap)(va[n], step, 0, h, 0) != CUDA_SUCCESS)
				return 4;
			SYM(cuda, cuMemRelease)(h); /* as the guide does: the mapping keeps the memory */
			mapped += step;
		}
		printf("vmm stopped by %d with %.0f MiB mapped (%s the limit)\n", r, (double)mapped / MiB,
		       mapped <= limit ? "within" : "PAST");
		for (int i = 0; i < n; i++) {
			SYM(cuda, cuMemUnmap)(va[i], step);
			SYM(cuda, cuMemAddressFree)(va[i], step);
		}
	} else if (strcmp(argv[1], "graphmem") == 0) {
		size_t limit = (size_t)strtoull(argv[2], NULL, 10) << 20;
		cuMemAlloc_v2_t *alloc = SYM(cuda, cuMemAlloc_v2);
		cuMemFree_v2_t *release = SYM(cuda, cuMemFree_v2);
		CUdeviceptr p;
		const size_t sizes[] = { limit + (64 << 20), limit / 2 };
		for (int i = 0; i < 2; i++) {
			CUgraph g;
			CUgraphNode node;
			CUgraphExec exec;
			CUDA_MEM_ALLOC_NODE_PARAMS np = { .poolProps = { .allocType = 1, .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } },
							  .bytesize = sizes[i] };
			if (SYM(cuda, cuGraphCreate)(&g, 0) != CUDA_SUCCESS ||
			    SYM(cuda, cuGraphAddMemAllocNode)(&node, g, NULL, 0, &np) != CUDA_SUCCESS)
				return 4;
			r = SYM(cuda, cuGraphInstantiateWithFlags)(&exec, g, 0);
			printf("graph of %s = %d\n", i == 0 ? "limit + 64 MiB" : "limit/2", r);
			if (r == CUDA_SUCCESS) {
				TRY_ALLOC("graph held", limit / 2 + (64 << 20));
				printf("graph exec destroy = %d\n", SYM(cuda, cuGraphExecDestroy)(exec));
				TRY_ALLOC("graph destroyed", limit / 4);
			}
			SYM(cuda, cuGraphDestroy)(g);
		}
	} else if (strcmp(argv[1], "module") == 0) {
		size_t limit = (size_t)strtoull(argv[2], NULL, 10) << 20;
		cuMemAlloc_v2_t *alloc = SYM(cuda, cuMemAlloc_v2);
		cuMemFree_v2_t *release = SYM(cuda, cuMemFree_v2);
		CUdeviceptr p, held, global;
		size_t gbytes = 0;
		if (alloc(&held, 16 << 20) != CUDA_SUCCESS) /* the reconciliation runs here */
			return 4;
		char text[512];
		snprintf(text, sizeof(text), ".version 6.0\n.target sm_50\n.address_size 64\n"
			 ".visible .global .align 8 .b8 big[%zu];\n", limit / 2);
		CUmodule m;
		r = SYM(cuda, cuModuleLoadData)(&m, text);
		printf("module of limit/2 = %d\n", r);
		if (r != CUDA_SUCCESS)
			return 4;
		/* with lazy loading the driver may take the array only now */
		printf("module global = %d (%.0f MiB)\n", SYM(cuda, cuModuleGetGlobal_v2)(&global, &gbytes, m, "big"),
		       (double)gbytes / MiB);
		TRY_ALLOC("module held", limit / 2 + (64 << 20));
		printf("module unload = %d\n", SYM(cuda, cuModuleUnload)(m));
		TRY_ALLOC("module unloaded", limit / 4);
		release(held);
	} else if (strcmp(argv[1], "bypass") == 0 && argc == 4) {
		typedef void *dlsym_t(void *, const char *);
		void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
		dlsym_t *real_dlsym = libc ? (dlsym_t *)dlvsym(libc, "dlsym", "GLIBC_2.34") : NULL;
		if (real_dlsym == NULL && libc != NULL)
			real_dlsym = (dlsym_t *)dlvsym(libc, "dlsym", "GLIBC_2.2.5");
		cuMemAlloc_v2_t *alloc = real_dlsym ? (cuMemAlloc_v2_t *)real_dlsym(cuda, "cuMemAlloc_v2") : NULL;
		if (alloc == NULL) {
			fprintf(stderr, "gpu_check: libc's dlsym or the driver's cuMemAlloc_v2 not found\n");
			return 2;
		}
		CUdeviceptr p;
		printf("bypass_alloc=%d\n", alloc(&p, (size_t)strtoull(argv[2], NULL, 10) << 20));
		fflush(stdout);
		sleep((unsigned)atoi(argv[3]));
	} else if (strcmp(argv[1], "spin") == 0 && argc == 4) {
		double seconds = atof(argv[2]);
		unsigned long long cycles = strtoull(argv[3], NULL, 10);
		void *params[] = { &cycles };
		CUfunction f = kernel("spin");
		cuLaunchKernel_t *launch = SYM(cuda, cuLaunchKernel);
		long n = 0;
		double t0 = now_ns();
		while (now_ns() - t0 < seconds * 1e9) {
			if (launch(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) != CUDA_SUCCESS)
				return 6;
			if (++n % 4 == 0)
				SYM(cuda, cuCtxSynchronize)();
		}
		SYM(cuda, cuCtxSynchronize)();
		printf("kernels_per_s=%.2f\n", (double)n / ((now_ns() - t0) / 1e9));
	}
	return 0;
}
