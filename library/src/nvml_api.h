/* Minimal NVML declarations, written from the public NVML API reference.
 * Only what the hooks and the test doubles use. Not NVIDIA's header. */
#ifndef VGPU_NVML_API_H
#define VGPU_NVML_API_H

typedef int nvmlReturn_t;
enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_NO_PERMISSION = 4,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
	NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
	unsigned int version;
	unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

/* nvmlDeviceGetComputeRunningProcesses (v1) */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* nvmlDeviceGetComputeRunningProcesses_v2 and _v3 */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* nvmlDeviceGetProcessUtilization */
typedef struct {
	unsigned int pid;
	unsigned long long timeStamp; /* microseconds */
	unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

/* nvmlDeviceGetProcessesUtilizationInfo: the pid is not the first member here */
typedef struct {
	unsigned long long timeStamp; /* microseconds */
	unsigned int pid;
	unsigned int smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;

typedef struct {
	unsigned int version;
	unsigned int processSamplesCount; /* in: the array's size; out: the samples */
	unsigned long long lastSeenTimeStamp;
	nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_t;

/* nvmlDeviceGetRunningProcessDetailList */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
	unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessDetail_v1_t;

typedef struct {
	unsigned int version;
	unsigned int mode; /* compute, graphics or MPS compute */
	unsigned int numProcArrayEntries; /* in: the array's size; out: the processes */
	nvmlProcessDetail_v1_t *procArray;
} nvmlProcessDetailList_t;

/* nvmlDeviceGetEncoderSessions */
typedef struct {
	unsigned int sessionId, pid, vgpuInstance, codecType;
	unsigned int hResolution, vResolution, averageFps, averageLatency;
} nvmlEncoderSessionInfo_t;

/* nvmlDeviceGetFBCSessions */
typedef struct {
	unsigned int sessionId, pid, vgpuInstance, displayOrdinal, sessionType, sessionFlags;
	unsigned int hMaxResolution, vMaxResolution, hResolution, vResolution, averageFPS, averageLatency;
} nvmlFBCSessionInfo_t;

/* nvmlDeviceGetAccountingStats */
typedef struct {
	unsigned int gpuUtilization, memoryUtilization;
	unsigned long long maxMemoryUsage;
	unsigned long long time, startTime; /* milliseconds, microseconds since the epoch */
	unsigned int isRunning;
	unsigned int reserved[5];
} nvmlAccountingStats_t;

/* A versioned struct's version: its size and the version in the top byte. */
#define VGPU_NVML_STRUCT_VERSION(type, ver) ((unsigned int)(sizeof(type) | ((unsigned int)(ver) << 24)))
#define nvmlProcessesUtilizationInfo_v1 VGPU_NVML_STRUCT_VERSION(nvmlProcessesUtilizationInfo_t, 1)
#define nvmlProcessDetailList_v1 VGPU_NVML_STRUCT_VERSION(nvmlProcessDetailList_t, 1)

#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

#endif
