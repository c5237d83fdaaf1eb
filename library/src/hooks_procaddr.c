/* cuGetProcAddress / cuGetProcAddress_v2: since CUDA 12 the runtime fetches every entry point
 * here, by base name ("cuMemAlloc") plus the CUDA version it was built for and a stream
 * mode. The driver answers first; then the answer is swapped for the hook that wraps exactly
 * that variant:
 *  1. by identity: the pointer the driver returned is the export of one of our variants, of
 *     this base name or any other (for "cuGraphInstantiate" the driver hands out
 *     cuGraphInstantiateWithFlags from CUDA 12.0: the hook of the function handed out is
 *     always the one of the right signature);
 *  2. else by the published version history: the variant with the highest introduction
 *     version <= cudaVersion, per-thread-stream variants for
 *     CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; the driver's pointer becomes that
 *     variant's real function if the driver does not export it.
 * Variants of an empty base name are swapped only by identity. Names we do not hook come
 * back untouched. */
#include <string.h>

#include "hook_table.h"
#include "hooks.h"

static int pick_by_version(const char *symbol, int cuda_version, int ptds)
{
	int best = -1;
	for (int i = 0; i < VGPU_HOOK_COUNT; i++) {
		const struct vgpu_hook *h = &vgpu_hooks[i];
		if (h->base == NULL || h->base[0] == '\0' || strcmp(h->base, symbol) != 0 || h->ptds != ptds || h->min_version > cuda_version)
			continue;
		if (best < 0 || h->min_version > vgpu_hooks[best].min_version)
			best = i;
	}
	return best;
}

static int route(const char *symbol, void *driver_fn, int cuda_version, cuuint64_t flags)
{
	for (int i = 0; i < VGPU_HOOK_COUNT; i++) {
		const struct vgpu_hook *h = &vgpu_hooks[i];
		if (h->lib == VGPU_LIB_CUDA && vgpu_real((enum vgpu_hook_id)i) == driver_fn)
			return i; /* 1. the driver handed out the export of this very function */
	}
	int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
	int best = pick_by_version(symbol, cuda_version, ptds);
	if (best < 0 && ptds)
		best = pick_by_version(symbol, cuda_version, 0); /* no per-thread variant of this name */
	return best;
}

static void *swap_for_hook(const char *symbol, void *driver_fn, int cuda_version, cuuint64_t flags)
{
	if (symbol == NULL || driver_fn == NULL || vgpu_is_hook(driver_fn))
		return driver_fn;
	int id = route(symbol, driver_fn, cuda_version, flags);
	if (id < 0)
		return driver_fn;
	vgpu_real_offer((enum vgpu_hook_id)id, driver_fn);
	return vgpu_hooks[id].hook;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *symbolStatus)
{
	__typeof__(&cuGetProcAddress_v2) real = REAL(cuGetProcAddress_v2);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
	if (r == CUDA_SUCCESS && pfn != NULL)
		*pfn = swap_for_hook(symbol, *pfn, cudaVersion, flags);
	return r;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	__typeof__(&cuGetProcAddress) real = REAL(cuGetProcAddress);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(symbol, pfn, cudaVersion, flags);
	if (r == CUDA_SUCCESS && pfn != NULL)
		*pfn = swap_for_hook(symbol, *pfn, cudaVersion, flags);
	return r;
}
