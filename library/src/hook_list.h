/* Every entry point the library hooks, as X-macros (one list: the table, the prototypes'
 * ids and the version script test all come from it).
 *
 * CUDA: X(exported name, base name for cuGetProcAddress, CUDA version from which the driver
 * hands out this variant for the base name, 1 for a per-thread-default-stream variant).
 * Versions follow the public driver API's _v2 history (3.2 = 3020 for the 64-bit memory
 * API, ...). An empty base name: the variant is never handed out by version, only when the
 * driver's answer is its very export (hooks_procaddr.c): the five-argument cuGraphInstantiate
 * and _v2, whose base name the driver resolves to cuGraphInstantiateWithFlags's three
 * arguments from CUDA 12.0. */
#ifndef VGPU_HOOK_LIST_H
#define VGPU_HOOK_LIST_H

#define VGPU_CUDA_HOOKS(X)                                                  \
	X(cuInit, cuInit, 2000, 0)                                          \
	X(cuGetProcAddress, cuGetProcAddress, 11030, 0)                     \
	X(cuGetProcAddress_v2, cuGetProcAddress, 12000, 0)                  \
	X(cuDeviceTotalMem, cuDeviceTotalMem, 2000, 0)                      \
	X(cuDeviceTotalMem_v2, cuDeviceTotalMem, 3020, 0)                   \
	X(cuMemGetInfo, cuMemGetInfo, 2000, 0)                              \
	X(cuMemGetInfo_v2, cuMemGetInfo, 3020, 0)                           \
	X(cuMemAlloc, cuMemAlloc, 2000, 0)                                  \
	X(cuMemAlloc_v2, cuMemAlloc, 3020, 0)                               \
	X(cuMemAllocPitch, cuMemAllocPitch, 2000, 0)                        \
	X(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0)                     \
	X(cuMemAllocManaged, cuMemAllocManaged, 6000, 0)                    \
	X(cuMemAllocAsync, cuMemAllocAsync, 11020, 0)                       \
	X(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, 1)                  \
	X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0)       \
	X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, 1)  \
	X(cuMemPoolCreate, cuMemPoolCreate, 11020, 0)                       \
	X(cuMemPoolDestroy, cuMemPoolDestroy, 11020, 0)                     \
	X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, 11020, 0)   \
	X(cuDeviceGetMemPool, cuDeviceGetMemPool, 11020, 0)                 \
	X(cuDeviceSetMemPool, cuDeviceSetMemPool, 11020, 0)                 \
	X(cuMemGetDefaultMemPool, cuMemGetDefaultMemPool, 13000, 0)         \
	X(cuMemGetMemPool, cuMemGetMemPool, 13000, 0)                       \
	X(cuMemSetMemPool, cuMemSetMemPool, 13000, 0)                       \
	X(cuMemCreate, cuMemCreate, 10020, 0)                               \
	X(cuMemRelease, cuMemRelease, 10020, 0)                             \
	X(cuMemMap, cuMemMap, 10020, 0)                                     \
	X(cuMemUnmap, cuMemUnmap, 10020, 0)                                 \
	X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, 0) \
	X(cuArrayCreate, cuArrayCreate, 2000, 0)                            \
	X(cuArrayCreate_v2, cuArrayCreate, 3020, 0)                         \
	X(cuArray3DCreate, cuArray3DCreate, 2000, 0)                        \
	X(cuArray3DCreate_v2, cuArray3DCreate, 3020, 0)                     \
	X(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0)          \
	X(cuArrayDestroy, cuArrayDestroy, 2000, 0)                          \
	X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0)        \
	X(cuModuleLoad, cuModuleLoad, 2000, 0)                              \
	X(cuModuleLoadData, cuModuleLoadData, 2000, 0)                      \
	X(cuModuleLoadDataEx, cuModuleLoadDataEx, 2010, 0)                  \
	X(cuModuleLoadFatBinary, cuModuleLoadFatBinary, 2000, 0)            \
	X(cuModuleUnload, cuModuleUnload, 2000, 0)                          \
	X(cuLibraryLoadData, cuLibraryLoadData, 12000, 0)                   \
	X(cuLibraryLoadFromFile, cuLibraryLoadFromFile, 12000, 0)           \
	X(cuLibraryUnload, cuLibraryUnload, 12000, 0)                       \
	X(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040, 0)         \
	X(cuGraphDestroyNode, cuGraphDestroyNode, 10000, 0)                 \
	X(cuGraphDestroy, cuGraphDestroy, 10000, 0)                         \
	X(cuGraphClone, cuGraphClone, 10000, 0)                             \
	X(cuGraphInstantiate, , 10000, 0)                                   \
	X(cuGraphInstantiate_v2, , 11000, 0)                                \
	X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0) \
	X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, 0) \
	X(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams, 12000, 1) \
	X(cuGraphExecDestroy, cuGraphExecDestroy, 10000, 0)                 \
	X(cuCtxSetLimit, cuCtxSetLimit, 3010, 0)                            \
	X(cuMemFree, cuMemFree, 2000, 0)                                    \
	X(cuMemFree_v2, cuMemFree, 3020, 0)                                 \
	X(cuMemFreeAsync, cuMemFreeAsync, 11020, 0)                         \
	X(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, 1)                    \
	X(cuLaunch, cuLaunch, 2000, 0)                                      \
	X(cuLaunchGrid, cuLaunchGrid, 2000, 0)                              \
	X(cuLaunchGridAsync, cuLaunchGridAsync, 2000, 0)                    \
	X(cuLaunchKernel, cuLaunchKernel, 4000, 0)                          \
	X(cuLaunchKernel_ptsz, cuLaunchKernel, 7000, 1)                     \
	X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 0)    \
	X(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, 9000, 1) \
	X(cuLaunchKernelEx, cuLaunchKernelEx, 11060, 0)                     \
	X(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, 11060, 1)                \
	X(cuGraphLaunch, cuGraphLaunch, 10000, 0)                           \
	X(cuGraphLaunch_ptsz, cuGraphLaunch, 10000, 1)

/* NVML: X(exported name). NVML has no proc-address route; symbols and dlsym only. */
#define VGPU_NVML_HOOKS(X)                        \
	X(nvmlInit)                               \
	X(nvmlInit_v2)                            \
	X(nvmlInitWithFlags)                      \
	X(nvmlDeviceGetMemoryInfo)                \
	X(nvmlDeviceGetMemoryInfo_v2)             \
	X(nvmlDeviceGetComputeRunningProcesses)   \
	X(nvmlDeviceGetComputeRunningProcesses_v2) \
	X(nvmlDeviceGetComputeRunningProcesses_v3) \
	X(nvmlDeviceGetGraphicsRunningProcesses)  \
	X(nvmlDeviceGetGraphicsRunningProcesses_v2) \
	X(nvmlDeviceGetGraphicsRunningProcesses_v3) \
	X(nvmlDeviceGetMPSComputeRunningProcesses) \
	X(nvmlDeviceGetMPSComputeRunningProcesses_v2) \
	X(nvmlDeviceGetMPSComputeRunningProcesses_v3) \
	X(nvmlDeviceGetRunningProcessDetailList)  \
	X(nvmlDeviceGetProcessUtilization)        \
	X(nvmlDeviceGetProcessesUtilizationInfo)  \
	X(nvmlDeviceGetEncoderSessions)           \
	X(nvmlDeviceGetFBCSessions)               \
	X(nvmlDeviceGetAccountingPids)            \
	X(nvmlDeviceGetAccountingStats)

/* Functions of the driver the hooks call without hooking them. */
#define VGPU_CUDA_USED(X)      \
	X(cuCtxGetDevice)      \
	X(cuDeviceGetCount)    \
	X(cuDeviceGetUuid)     \
	X(cuCtxGetCurrent)     \
	X(cuStreamGetCtx)      \
	X(cuCtxPushCurrent_v2) \
	X(cuCtxPopCurrent_v2)  \
	X(cuDeviceGetAttribute) \
	X(cuStreamIsCapturing) \
	X(cuStreamSynchronize) \
	X(cuEventCreate)       \
	X(cuEventRecord)       \
	X(cuEventQuery)        \
	X(cuEventDestroy_v2)   \
	X(cuGraphNodeFindInClone) \
	X(cuGraphGetNodes)        \
	X(cuGraphNodeGetType)     \
	X(cuGraphKernelNodeGetParams) \
	X(cuGraphKernelNodeGetParams_v2) \
	X(cuGraphChildGraphNodeGetGraph)

#define VGPU_NVML_USED(X)                     \
	X(nvmlDeviceGetHandleByUUID)          \
	X(nvmlDeviceGetUUID)

#endif
