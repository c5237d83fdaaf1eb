/* Runs with libvgpu and the interposer preloaded, in either order; prints what it sees. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../../src/hooks.h"

CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev);

int main(void)
{
	int *calls = dlsym(RTLD_DEFAULT, "interposer_calls");
	time_t t = time(NULL);
	printf("time %s\n", t > 1000000000 ? "ok" : "broken");
	/* the main program's RTLD_NEXT: the first definition after it, i.e. the interposer's */
	void *next_time = dlsym(RTLD_NEXT, "time");
	Dl_info info;
	printf("next time in %s\n", next_time && dladdr(next_time, &info) && strstr(info.dli_fname, "interposer")
					   ? "interposer"
					   : "something else");
	CUcontext ctx;
	if (cuInit(0) != CUDA_SUCCESS || cuCtxCreate_v2(&ctx, 0, 0) != CUDA_SUCCESS)
		return 3;
	CUdeviceptr p;
	printf("alloc over limit = %d\n", cuMemAlloc_v2(&p, 300ull << 20));
	printf("alloc within limit = %d\n", cuMemAlloc_v2(&p, 1ull << 20));
	printf("interposer calls %d\n", calls ? *calls : -1);
	return 0;
}
