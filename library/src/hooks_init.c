/* cuInit and nvmlInit*: where a process first meets the library. The mode (and with it the
 * registration) is decided here, before the driver initialises. */
#include "hook_table.h"
#include "hooks.h"
#include "runtime.h"

CUresult cuInit(unsigned int flags)
{
	__typeof__(&cuInit) real = REAL(cuInit);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	if (vgpu_runtime_mode() == VGPU_MODE_REFUSED) {
		vgpu_runtime_report_refusal();
		return CUDA_ERROR_NOT_PERMITTED;
	}
	CUresult r = real(flags);
	if (r != CUDA_SUCCESS)
		return r;
	if (vgpu_runtime_map_cuda() == VGPU_MODE_REFUSED)
		return CUDA_ERROR_NOT_PERMITTED;
	return r;
}

static nvmlReturn_t after_nvml_init(nvmlReturn_t r)
{
	if (r != NVML_SUCCESS)
		return r;
	if (vgpu_runtime_mode() == VGPU_MODE_REFUSED) {
		vgpu_runtime_report_refusal();
		return NVML_ERROR_NO_PERMISSION;
	}
	return r;
}

nvmlReturn_t nvmlInit_v2(void)
{
	__typeof__(&nvmlInit_v2) real = REAL(nvmlInit_v2);
	return real == NULL ? NVML_ERROR_UNKNOWN : after_nvml_init(real());
}

nvmlReturn_t nvmlInit(void)
{
	__typeof__(&nvmlInit) real = REAL(nvmlInit);
	return real == NULL ? NVML_ERROR_UNKNOWN : after_nvml_init(real());
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	__typeof__(&nvmlInitWithFlags) real = REAL(nvmlInitWithFlags);
	return real == NULL ? NVML_ERROR_UNKNOWN : after_nvml_init(real(flags));
}
