/* TEST DOUBLE: what the fake libcuda.so.1's files share (fake_cuda.c: devices, contexts,
 * allocations, launches; fake_vmm.c: virtual memory management; fake_stream.c: streams,
 * events, stream-ordered frees). Not part of any API. */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H

#include <stdint.h>

#include "../../src/cuda_api.h"
#include "fake_state.h"

#define API __attribute__((visibility("default")))

/* One allocation of this process: a device pointer or a VMM handle. A handle's physical
 * memory lives while the application holds a reference to it (cuMemCreate,
 * cuMemRetainAllocationHandle; each cuMemRelease drops one) or a mapping of it (cuMemMap),
 * as the driver's does: the bytes are charged until both are gone. */
struct fake_alloc {
	uint64_t key, bytes;
	int dev;
	void *host;
	uint32_t refs; /* VMM handles: references the application holds */
	uint32_t maps; /* VMM handles: mappings of it */
	int freeing;   /* a stream-ordered free of it is queued */
};

int fake_initialised(void);
/* CUDA ordinal -> device index in the shared state, or -1. */
int fake_device_of(int ordinal);
/* Charges bytes on dev and records the allocation under a new key. */
CUresult fake_alloc_on(int dev, uint64_t bytes, uint64_t *key, int v1);
/* Forgets the allocation and gives its bytes back. */
CUresult fake_free_key(uint64_t key);

/* A module image the fake knows: the magic, then the bytes of its __device__ globals. A
 * module takes FAKE_MODULE_CODE_BYTES for its code plus its globals from load to unload, as
 * the driver's do; any other image is code only. */
#define FAKE_MODULE_MAGIC "FAKEMOD"
#define FAKE_MODULE_CODE_BYTES (64ull * 1024ull)
struct fake_module_image {
	char magic[8];
	uint64_t globals_bytes;
};
/* The allocation recorded under key, or NULL. */
struct fake_alloc *fake_alloc_find(uint64_t key);

/* Occupies the current device for blocks * FAKE_NS_PER_BLOCK ns, as a kernel launch does. */
CUresult fake_launch(uint64_t blocks);

/* VMM entry points (fake_vmm.c), for cuGetProcAddress's table. */
API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
		     unsigned long long flags);
API CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
			     unsigned long long flags);
API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
		  unsigned long long flags);
API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr);

/* The CUDA ordinal of the thread's current context, -1 for none. */
int fake_current_ordinal(void);
API CUresult cuCtxSetCurrent(CUcontext ctx);
API CUresult cuCtxPushCurrent_v2(CUcontext ctx);
API CUresult cuCtxPopCurrent_v2(CUcontext *ctx);

/* Streams (fake_stream.c): cuCtxSynchronize runs every stream as far as it can go. */
void fake_streams_drain(void);
/* The CUDA ordinal of a stream's device (the current context's for the default streams), -1
 * for none. */
int fake_stream_ordinal(CUstream stream);
API CUresult cuStreamGetCtx(CUstream stream, CUcontext *ctx);
API CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
API CUresult cuStreamSynchronize(CUstream stream);
API CUresult cuStreamQuery(CUstream stream);
API CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status);
API CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, uint32_t value, unsigned int flags);
API CUresult cuEventCreate(CUevent *event, unsigned int flags);
API CUresult cuEventRecord(CUevent event, CUstream stream);
API CUresult cuEventQuery(CUevent event);
API CUresult cuEventDestroy_v2(CUevent event);
API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);

/* Memory pools and stream-ordered allocations (fake_pool.c): a pool lives on a device; an
 * allocation from it is charged there, cuMemAllocAsync's on the stream's device (from that
 * device's current pool). */
API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
API CUresult cuMemPoolDestroy(CUmemoryPool pool);
API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
API CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
API CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type);
API CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type);
API CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type, CUmemoryPool pool);
API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
					  CUstream stream);

/* Graphs (fake_graph.c). */
API CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
API CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
				    CUDA_MEM_ALLOC_NODE_PARAMS *params);
API CUresult cuGraphDestroyNode(CUgraphNode node);
API CUresult cuGraphDestroy(CUgraph graph);
API CUresult cuGraphClone(CUgraph *clone, CUgraph original);
API CUresult cuGraphNodeFindInClone(CUgraphNode *clone_node, CUgraphNode original_node, CUgraph clone);
API CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *err_node, char *log, size_t log_size);
API CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *err_node, char *log,
				   size_t log_size);
API CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
API CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params);
API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
					       CUDA_GRAPH_INSTANTIATE_PARAMS *params);
API CUresult cuGraphExecDestroy(CUgraphExec exec);
API CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
				  const CUDA_KERNEL_NODE_PARAMS *params);
API CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
				     const CUDA_KERNEL_NODE_PARAMS *params);
API CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
				      CUgraph child);
API CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *graph);
API CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count);
API CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type);
API CUresult cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params);
API CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params);
API CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
API CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream);

#endif
