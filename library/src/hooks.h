/* Prototypes of every hook (exported by libvgpu.so under the driver's names) and of the
 * driver functions the hooks call. Types from the library's own declarations. */
#ifndef VGPU_HOOKS_H
#define VGPU_HOOKS_H

#include "cuda_api.h"
#include "nvml_api.h"

#define VGPU_EXPORT __attribute__((visibility("default")))

VGPU_EXPORT CUresult cuInit(unsigned int flags);
VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
VGPU_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
					 CUdriverProcAddressQueryResult *symbolStatus);
VGPU_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
VGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
VGPU_EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);
VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
VGPU_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
VGPU_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width,
				     unsigned int height, unsigned int elementSize);
VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
					unsigned int elementSize);
VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
					     CUstream stream);
VGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
						  CUstream stream);
VGPU_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
VGPU_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool);
VGPU_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
VGPU_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
VGPU_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
VGPU_EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type);
VGPU_EXPORT CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type);
VGPU_EXPORT CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type, CUmemoryPool pool);
VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
				 const CUmemAllocationProp *prop, unsigned long long flags);
VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
VGPU_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			      unsigned long long flags);
VGPU_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
VGPU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr);
VGPU_EXPORT CUresult cuArrayCreate(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR_v1 *desc);
VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc);
VGPU_EXPORT CUresult cuArray3DCreate(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc);
VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc);
VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
					    unsigned int numMipmapLevels);
VGPU_EXPORT CUresult cuArrayDestroy(CUarray handle);
VGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray handle);
VGPU_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname);
VGPU_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image);
VGPU_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int num_options,
					CUjit_option *options, void **option_values);
VGPU_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fat_cubin);
VGPU_EXPORT CUresult cuModuleUnload(CUmodule module);
VGPU_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jit_options,
				       void **jit_option_values, unsigned int num_jit_options,
				       CUlibraryOption *library_options, void **library_option_values,
				       unsigned int num_library_options);
VGPU_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *file_name, CUjit_option *jit_options,
					   void **jit_option_values, unsigned int num_jit_options,
					   CUlibraryOption *library_options, void **library_option_values,
					   unsigned int num_library_options);
VGPU_EXPORT CUresult cuLibraryUnload(CUlibrary library);
VGPU_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
					    size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS *params);
VGPU_EXPORT CUresult cuGraphDestroyNode(CUgraphNode node);
VGPU_EXPORT CUresult cuGraphDestroy(CUgraph graph);
VGPU_EXPORT CUresult cuGraphClone(CUgraph *clone, CUgraph original);
VGPU_EXPORT CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *err_node, char *log,
					size_t log_size);
VGPU_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *err_node, char *log,
					   size_t log_size);
VGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
VGPU_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph,
						  CUDA_GRAPH_INSTANTIATE_PARAMS *params);
VGPU_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
						       CUDA_GRAPH_INSTANTIATE_PARAMS *params);
VGPU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec);
VGPU_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value);
VGPU_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr);
VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr);
VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
VGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
VGPU_EXPORT CUresult cuLaunch(CUfunction f);
VGPU_EXPORT CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height);
VGPU_EXPORT CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream stream);
VGPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
				    unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
				    CUstream stream, void **params, void **extra);
VGPU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
					 unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
					 CUstream stream, void **params, void **extra);
VGPU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
					       unsigned int bx, unsigned int by, unsigned int bz,
					       unsigned int shmem, CUstream stream, void **params);
VGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
						    unsigned int gz, unsigned int bx, unsigned int by,
						    unsigned int bz, unsigned int shmem, CUstream stream,
						    void **params);
VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra);
VGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params,
					   void **extra);
VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
VGPU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream);

VGPU_EXPORT nvmlReturn_t nvmlInit(void);
VGPU_EXPORT nvmlReturn_t nvmlInit_v2(void);
VGPU_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
							      nvmlProcessInfo_v1_t *infos);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
								 nvmlProcessInfo_t *infos);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
								 nvmlProcessInfo_t *infos);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *count,
							       nvmlProcessInfo_v1_t *infos);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
								  nvmlProcessInfo_t *infos);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
								  nvmlProcessInfo_t *infos);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
								 nvmlProcessInfo_v1_t *infos);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
								    nvmlProcessInfo_t *infos);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
								    nvmlProcessInfo_t *infos);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_t *plist);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
							 nvmlProcessUtilizationSample_t *samples,
							 unsigned int *count, unsigned long long lastSeenTimeStamp);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device,
							       nvmlProcessesUtilizationInfo_t *info);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetEncoderSessions(nvmlDevice_t device, unsigned int *count,
						      nvmlEncoderSessionInfo_t *infos);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetFBCSessions(nvmlDevice_t device, unsigned int *count, nvmlFBCSessionInfo_t *infos);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t device, unsigned int *count, unsigned int *pids);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t device, unsigned int pid,
						      nvmlAccountingStats_t *stats);

/* Driver functions called, never hooked (declared for their types only). */
CUresult cuCtxGetDevice(CUdevice *dev);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult cuCtxGetCurrent(CUcontext *ctx);
CUresult cuStreamGetCtx(CUstream stream, CUcontext *ctx);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *ctx);
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuEventCreate(CUevent *event, unsigned int flags);
CUresult cuEventRecord(CUevent event, CUstream stream);
CUresult cuEventQuery(CUevent event);
CUresult cuEventDestroy_v2(CUevent event);
CUresult cuGraphNodeFindInClone(CUgraphNode *clone_node, CUgraphNode original_node, CUgraph clone);
CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count);
CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type);
CUresult cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params);
CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params);
CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *graph);
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);

#endif
