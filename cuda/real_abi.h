// The libcuda driver ABI as kvbm declares it by hand (integers and void
// pointers, as the driver's ABI has them), so that building needs no CUDA
// headers; real_trampolines.c includes it. cuda/abicheck/abicheck.c
// includes it after the real cuda.h (with KV_ABI_CHECK defined) and
// checks every struct, constant and function pointer type here against
// CUDA 12.8's and 13.0's headers, and NVML's against nvml.h (make
// test-cuda-abi).
#ifndef KVBM_REAL_ABI_H
#define KVBM_REAL_ABI_H

#include <stddef.h>

#ifndef KV_ABI_CHECK
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUmodule;
typedef void *CUfunction;
typedef unsigned long long CUdeviceptr;
// KV_T(T): kvbm's own declaration of cuda.h's struct T; KV_ENUM(E): an
// int where cuda.h has enum E. Under the check they are cuda.h's types, so
// that the function pointer types below compare with its PFN_ types.
#define KV_T(T) kv_##T
#define KV_ENUM(E) int
#else
#define KV_T(T) T
#define KV_ENUM(E) E
#endif

// CUmemLocation and CUmemcpyAttributes as in cuda.h (CUDA 12.8 and later).
typedef struct {
	int type; // CUmemLocationType
	int id;
} kv_CUmemLocation;
typedef struct {
	int srcAccessOrder; // CUmemcpySrcAccessOrder
	kv_CUmemLocation srcLocHint;
	kv_CUmemLocation dstLocHint;
	unsigned int flags;
} kv_CUmemcpyAttributes;

// CUipcMemHandle as in cuda.h: 64 opaque bytes, passed by value.
typedef struct {
	char reserved[64];
} kv_CUipcMemHandle;

// The constants kvbm uses, each cuda.h's of the same name without KV_
// (cuda/real_abi.go holds the Go side's to these).
enum {
	KV_CU_MEM_LOCATION_TYPE_DEVICE = 1,
	KV_CU_MEM_LOCATION_TYPE_HOST = 2,
	KV_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1,
	KV_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
	KV_CU_STREAM_NON_BLOCKING = 0x1,
	KV_CU_STREAM_LEGACY = 0x1, // a stream handle, (CUstream)0x1
	KV_CU_EVENT_DISABLE_TIMING = 0x2,
	KV_CU_MEMHOSTALLOC_PORTABLE = 0x1,
	KV_CU_MEMHOSTALLOC_DEVICEMAP = 0x2,
	KV_CU_MEMHOSTREGISTER_PORTABLE = 0x1,
	KV_CU_MEMHOSTREGISTER_DEVICEMAP = 0x2,
	KV_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	KV_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	KV_CU_MEMORYTYPE_DEVICE = 2,
	KV_CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91,
	KV_CUDA_SUCCESS = 0,
	KV_CUDA_ERROR_INVALID_VALUE = 1,
	KV_CUDA_ERROR_OUT_OF_MEMORY = 2,
	KV_CUDA_ERROR_NOT_INITIALIZED = 3,
	KV_CUDA_ERROR_NO_DEVICE = 100,
	KV_CUDA_ERROR_INVALID_DEVICE = 101,
	KV_CUDA_ERROR_INVALID_CONTEXT = 201,
	KV_CUDA_ERROR_INVALID_HANDLE = 400,
	KV_CUDA_ERROR_NOT_READY = 600,
	KV_CUDA_ERROR_ILLEGAL_ADDRESS = 700,
	KV_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
	KV_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
	KV_CUDA_ERROR_NOT_SUPPORTED = 801,
	KV_CUDA_ERROR_UNKNOWN = 999,
};

// The libcuda symbols the table holds, X(name, parameters), each returning
// CUresult. Names follow the exported symbol, _v2 where the driver versions
// it. The table, the list of names dlsym resolves and the load all come from
// these two lists.
#define CU_REQUIRED_SYMBOLS(X)                                                              \
	X(cuGetErrorName, (CUresult, const char **))                                            \
	X(cuGetErrorString, (CUresult, const char **))                                          \
	X(cuInit, (unsigned))                                                                   \
	X(cuDriverGetVersion, (int *))                                                          \
	X(cuDeviceGetCount, (int *))                                                            \
	X(cuDeviceGet, (CUdevice *, int))                                                       \
	X(cuDeviceGetName, (char *, int, CUdevice))                                             \
	X(cuDeviceTotalMem_v2, (size_t *, CUdevice))                                            \
	X(cuDeviceGetAttribute, (int *, KV_ENUM(CUdevice_attribute), CUdevice))                                         \
	X(cuDeviceGetPCIBusId, (char *, int, CUdevice))                                         \
	X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                    \
	X(cuDevicePrimaryCtxRelease_v2, (CUdevice))                                             \
	X(cuCtxGetCurrent, (CUcontext *))                                                       \
	X(cuCtxSetCurrent, (CUcontext))                                                         \
	X(cuStreamCreate, (CUstream *, unsigned))                                               \
	X(cuStreamDestroy_v2, (CUstream))                                                       \
	X(cuStreamQuery, (CUstream))                                                            \
	X(cuStreamWaitEvent, (CUstream, CUevent, unsigned))                                     \
	X(cuStreamGetCtx, (CUstream, CUcontext *))                                              \
	X(cuEventCreate, (CUevent *, unsigned))                                                 \
	X(cuEventDestroy_v2, (CUevent))                                                         \
	X(cuEventRecord, (CUevent, CUstream))                                                   \
	X(cuEventQuery, (CUevent))                                                              \
	X(cuMemcpyHtoDAsync_v2, (CUdeviceptr, const void *, size_t, CUstream))                  \
	X(cuMemcpyDtoHAsync_v2, (void *, CUdeviceptr, size_t, CUstream))                        \
	X(cuMemcpyDtoDAsync_v2, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                   \
	X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                                               \
	X(cuMemFree_v2, (CUdeviceptr))                                                          \
	X(cuMemHostAlloc, (void **, size_t, unsigned))                                          \
	X(cuMemFreeHost, (void *))                                                              \
	X(cuMemHostRegister_v2, (void *, size_t, unsigned))                                     \
	X(cuMemHostUnregister, (void *))                                                        \
	X(cuPointerGetAttribute, (void *, KV_ENUM(CUpointer_attribute), CUdeviceptr))                                    \
	X(cuModuleLoadData, (CUmodule *, const void *))                                         \
	X(cuModuleGetFunction, (CUfunction *, CUmodule, const char *))                          \
	X(cuModuleUnload, (CUmodule))                                                           \
	X(cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,        \
	                   unsigned, unsigned, CUstream, void **, void **))

// Optional (CUDA 12.8+): either may be missing, see kv_cuda_batch_version.
#define CU_OPTIONAL_SYMBOLS(X)                                                              \
	X(cuMemcpyBatchAsync, (CUdeviceptr *, CUdeviceptr *, size_t *, size_t,                  \
	                       KV_T(CUmemcpyAttributes) *, size_t *, size_t, size_t *, CUstream))  \
	X(cuMemcpyBatchAsync_v2, (CUdeviceptr *, CUdeviceptr *, size_t *, size_t,               \
	                          KV_T(CUmemcpyAttributes) *, size_t *, size_t, CUstream))         \
	X(cuMemGetAddressRange_v2, (CUdeviceptr *, size_t *, CUdeviceptr))                      \
	X(cuIpcGetMemHandle, (KV_T(CUipcMemHandle) *, CUdeviceptr))                                \
	X(cuIpcOpenMemHandle_v2, (CUdeviceptr *, KV_T(CUipcMemHandle), unsigned))                  \
	X(cuIpcCloseMemHandle, (CUdeviceptr))

// NVML, as nvml.h declares it (checked against go-nvml's copy of it).
#ifndef KV_ABI_CHECK
typedef void *nvmlDevice_t;
typedef int nvmlReturn_t;
#endif
typedef struct {
	unsigned long long total, free, used;
} kv_nvmlMemory_t;

// The NVML symbols the table holds, X(name, parameters), each returning
// nvmlReturn_t.
#define NV_REQUIRED_SYMBOLS(X)                                                              \
	X(nvmlInit_v2, (void))                                                                  \
	X(nvmlDeviceGetCount_v2, (unsigned *))                                                  \
	X(nvmlDeviceGetHandleByPciBusId_v2, (const char *, nvmlDevice_t *))                     \
	X(nvmlDeviceGetMemoryInfo, (nvmlDevice_t, KV_T(nvmlMemory_t) *))

// Optional: r535 and later.
#define NV_OPTIONAL_SYMBOLS(X) X(nvmlDeviceGetNumaNodeId, (nvmlDevice_t, unsigned *))

#endif
