/* Minimal CUDA driver API declarations, written from the public CUDA Driver API
 * documentation. Only what the hooks and the test doubles use. Not NVIDIA's header. */
#ifndef VGPU_CUDA_API_H
#define VGPU_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_FILE_NOT_FOUND = 301,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_NOT_PERMITTED = 800,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_UNKNOWN = 999,
};

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;  /* _v2 pointers */
typedef unsigned int CUdeviceptr_v1;     /* legacy 32-bit pointers of the unversioned names */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef unsigned long long cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct CUmod_st *CUmodule;
typedef struct CUlib_st *CUlibrary;
typedef int CUjit_option;
typedef int CUlibraryOption;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUevent_st *CUevent;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUkern_st *CUkernel;

/* CUDA arrays' descriptors (cuArrayCreate, cuArray3DCreate, cuMipmappedArrayCreate): the
 * _v2 entry points take size_t extents, the unversioned ones unsigned int. Format codes are
 * the CUarray_format values whose element size the library knows. */
typedef int CUarray_format;
enum {
	CU_AD_FORMAT_UNSIGNED_INT8 = 0x01, CU_AD_FORMAT_UNSIGNED_INT16 = 0x02, CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
	CU_AD_FORMAT_SIGNED_INT8 = 0x08, CU_AD_FORMAT_SIGNED_INT16 = 0x09, CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
	CU_AD_FORMAT_HALF = 0x10, CU_AD_FORMAT_FLOAT = 0x20,
};
enum { CUDA_ARRAY3D_LAYERED = 0x01, CUDA_ARRAY3D_CUBEMAP = 0x04 };
typedef struct {
	size_t Width, Height;
	CUarray_format Format;
	unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct {
	unsigned int Width, Height;
	CUarray_format Format;
	unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct {
	size_t Width, Height, Depth;
	CUarray_format Format;
	unsigned int NumChannels;
	unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
typedef struct {
	unsigned int Width, Height, Depth;
	CUarray_format Format;
	unsigned int NumChannels;
	unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

/* cuCtxSetLimit's limits, and the device attributes the stack estimate reads. */
typedef int CUlimit;
enum { CU_LIMIT_STACK_SIZE = 0x00, CU_LIMIT_PRINTF_FIFO_SIZE = 0x01, CU_LIMIT_MALLOC_HEAP_SIZE = 0x02 };
typedef int CUdevice_attribute;
enum {
	CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
	CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
};

/* Stream handles with a meaning of their own, and what the stream API's flags mean. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
enum { CU_EVENT_DISABLE_TIMING = 0x2 };
typedef int CUstreamCaptureStatus;
enum { CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_STREAM_CAPTURE_STATUS_ACTIVE = 1, CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2 };
enum { CU_STREAM_WAIT_VALUE_GEQ = 0x0 };

typedef struct { char bytes[16]; } CUuuid;

/* cuMemCreate's allocation properties: only the documented leading members are read. */
enum {
	CU_MEM_LOCATION_TYPE_DEVICE = 1, CU_MEM_LOCATION_TYPE_HOST = 2, CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
	CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4,
};
typedef struct { int type; int id; } CUmemLocation;
typedef int CUmemAllocationType; /* pinned, managed (CUDA 13's pools by location) */
typedef struct {
	int type;
	int requestedHandleTypes;
	struct { int type; int id; } location;
	void *win32HandleMetaData;
	unsigned char allocFlags[8];
} CUmemAllocationProp;

/* Memory pools' properties (cuMemPoolCreate) and CUDA graphs' memory allocation nodes
 * (cuGraphAddMemAllocNode): the pool properties' size (88 bytes) is fixed by their reserved
 * tail across versions; only the location and the size are read. */
typedef struct {
	int allocType;
	int handleTypes;
	struct { int type; int id; } location;
	void *win32SecurityAttributes;
	unsigned char reserved[64];
} CUmemPoolProps;
typedef struct {
	CUmemPoolProps poolProps;
	const void *accessDescs;
	size_t accessDescCount;
	size_t bytesize;
	CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;
/* cuGraphInstantiateWithParams's parameters. */
typedef struct {
	cuuint64_t flags;
	CUstream hUploadStream;
	CUgraphNode hErrNode_out;
	int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

/* Graph nodes' types (cuGraphNodeGetType), those the launch cost looks at. */
typedef int CUgraphNodeType;
enum {
	CU_GRAPH_NODE_TYPE_KERNEL = 0, CU_GRAPH_NODE_TYPE_MEMCPY = 1, CU_GRAPH_NODE_TYPE_MEMSET = 2,
	CU_GRAPH_NODE_TYPE_HOST = 3, CU_GRAPH_NODE_TYPE_GRAPH = 4, CU_GRAPH_NODE_TYPE_EMPTY = 5,
	CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
};
/* A kernel node's parameters, the _v2 layout (CUDA 12.0): the original one is its prefix, up
 * to extra. Only the grid dimensions are read. */
typedef struct {
	CUfunction func;
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	void **kernelParams;
	void **extra;
	CUkernel kern;
	CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS;

/* cuLaunchKernelEx's configuration: only the grid dimensions are read. */
typedef struct {
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	void *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;

/* cuGetProcAddress flags and (CUDA 12) query result. */
enum {
	CU_GET_PROC_ADDRESS_DEFAULT = 0,
	CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
	CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2,
};
typedef int CUdriverProcAddressQueryResult;
enum { CU_GET_PROC_ADDRESS_SUCCESS = 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1 };

#endif
