/* Hooks of the virtual memory API: cuMemCreate is charged like an allocation; the bytes are
 * given back when the handle's last reference and last mapping are gone (vmm_account.h), as
 * the driver frees them. */
#include "hook_table.h"
#include "hooks.h"
#include "mem_account.h"
#include "vmm_account.h"

#define REAL_OR_FAIL(var, name)                 \
	__typeof__(&name) var = REAL(name);     \
	if (var == NULL)                        \
		return CUDA_ERROR_NOT_FOUND

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
		     unsigned long long flags)
{
	REAL_OR_FAIL(real, cuMemCreate);
	int ordinal = -1;
	if (prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
		ordinal = prop->location.id;
	struct vgpu_mem_op op;
	CUresult r = vgpu_mem_reserve(ordinal, size, &op);
	if (r != CUDA_SUCCESS)
		return r;
	/* under the lock: a handle value the driver hands out again is recorded only after the
	 * release that freed it has been booked */
	vgpu_vmm_lock();
	r = real(handle, size, prop, flags);
	vgpu_mem_commit(&op, r, VGPU_ALLOC_VMM_HANDLE, r == CUDA_SUCCESS ? *handle : 0);
	vgpu_vmm_unlock();
	return r;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	REAL_OR_FAIL(real, cuMemRelease);
	if (!vgpu_mem_enforcing())
		return real(handle);
	vgpu_vmm_lock();
	CUresult r = real(handle);
	if (r == CUDA_SUCCESS)
		vgpu_vmm_released(handle);
	vgpu_vmm_unlock();
	return r;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
		  unsigned long long flags)
{
	REAL_OR_FAIL(real, cuMemMap);
	if (!vgpu_mem_enforcing())
		return real(ptr, size, offset, handle, flags);
	vgpu_vmm_lock();
	CUresult r = real(ptr, size, offset, handle, flags);
	if (r == CUDA_SUCCESS)
		vgpu_vmm_mapped(ptr, size, handle);
	vgpu_vmm_unlock();
	return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	REAL_OR_FAIL(real, cuMemUnmap);
	if (!vgpu_mem_enforcing())
		return real(ptr, size);
	vgpu_vmm_lock();
	CUresult r = real(ptr, size);
	if (r == CUDA_SUCCESS)
		vgpu_vmm_unmapped(ptr, size);
	vgpu_vmm_unlock();
	return r;
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	REAL_OR_FAIL(real, cuMemRetainAllocationHandle);
	if (!vgpu_mem_enforcing())
		return real(handle, addr);
	vgpu_vmm_lock();
	CUresult r = real(handle, addr);
	if (r == CUDA_SUCCESS && handle != NULL)
		vgpu_vmm_retained(*handle);
	vgpu_vmm_unlock();
	return r;
}
