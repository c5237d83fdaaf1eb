/* Modules and libraries (cuModuleLoad*, cuLibraryLoad*: what cudart does for every fatbin,
 * and what JIT and plugin code does): the driver takes device memory for a module's
 * __device__ globals, its code and its constant banks, and does not say how much. The
 * library does not guess from the image (a fatbin's entries may be compressed, PTX is
 * compiled by the driver): after a load or an unload the next reservation or memory-info
 * answer on the GPU reads NVML's figure for the container at once (vgpu_mem_reconcile_next),
 * instead of up to a second later, so that an allocation right after a large module is
 * checked against what the module holds. With lazy loading (CUDA_MODULE_LOADING=LAZY, the
 * default from CUDA 12.2) the driver may take the memory at the module's first use; that is
 * seen by the next reconciliation. */
#include "hook_table.h"
#include "hooks.h"
#include "mem_account.h"

#define REAL_OR_FAIL(var, name)                 \
	__typeof__(&name) var = REAL(name);     \
	if (var == NULL)                        \
		return CUDA_ERROR_NOT_FOUND

static CUresult after(CUresult r)
{
	if (r == CUDA_SUCCESS)
		vgpu_mem_reconcile_next();
	return r;
}

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
	REAL_OR_FAIL(real, cuModuleLoad);
	return after(real(module, fname));
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	REAL_OR_FAIL(real, cuModuleLoadData);
	return after(real(module, image));
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int num_options, CUjit_option *options,
			    void **option_values)
{
	REAL_OR_FAIL(real, cuModuleLoadDataEx);
	return after(real(module, image, num_options, options, option_values));
}

CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fat_cubin)
{
	REAL_OR_FAIL(real, cuModuleLoadFatBinary);
	return after(real(module, fat_cubin));
}

CUresult cuModuleUnload(CUmodule module)
{
	REAL_OR_FAIL(real, cuModuleUnload);
	return after(real(module));
}

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jit_options, void **jit_option_values,
			   unsigned int num_jit_options, CUlibraryOption *library_options, void **library_option_values,
			   unsigned int num_library_options)
{
	REAL_OR_FAIL(real, cuLibraryLoadData);
	return after(real(library, code, jit_options, jit_option_values, num_jit_options, library_options,
			  library_option_values, num_library_options));
}

CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *file_name, CUjit_option *jit_options,
			       void **jit_option_values, unsigned int num_jit_options, CUlibraryOption *library_options,
			       void **library_option_values, unsigned int num_library_options)
{
	REAL_OR_FAIL(real, cuLibraryLoadFromFile);
	return after(real(library, file_name, jit_options, jit_option_values, num_jit_options, library_options,
			  library_option_values, num_library_options));
}

CUresult cuLibraryUnload(CUlibrary library)
{
	REAL_OR_FAIL(real, cuLibraryUnload);
	return after(real(library));
}
