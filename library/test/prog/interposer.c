/* A second preloaded interposer, as other tools in a container would bring (profilers,
 * shims). It wraps time() and cuMemAlloc_v2 and finds the next definitions with
 * dlsym(RTLD_NEXT, ...), the usual way. With libvgpu loaded before it, a dlsym that
 * resolved RTLD_NEXT relative to libvgpu would hand the wrapper itself back: endless
 * recursion. Counts its calls in interposer_calls. */
#include <dlfcn.h>
#include <time.h>

#include "../../src/cuda_api.h"

__attribute__((visibility("default"))) int interposer_calls;

__attribute__((visibility("default"))) time_t time(time_t *t)
{
	static time_t (*next)(time_t *);
	if (next == NULL)
		next = (time_t(*)(time_t *))dlsym(RTLD_NEXT, "time");
	if ((void *)next == (void *)time)
		return (time_t)-2; /* would recurse: report instead of crashing */
	interposer_calls++;
	return next(t);
}

__attribute__((visibility("default"))) CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
	static CUresult (*next)(CUdeviceptr *, size_t);
	if (next == NULL)
		next = (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_NEXT, "cuMemAlloc_v2");
	if (next == NULL || (void *)next == (void *)cuMemAlloc_v2)
		return CUDA_ERROR_UNKNOWN;
	interposer_calls++;
	return next(dptr, bytes);
}
