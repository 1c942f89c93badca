// Checks cuda/real_abi.h, the driver ABI kvbm declares by hand, against a
// real cuda.h and cudaTypedefs.h (scripts/cuda-abi-check.sh compiles it
// against CUDA 12.8's and 13.0's, from NVIDIA's pip packages, and go-nvml's
// copy of nvml.h): every struct
// kvbm declares has cuda.h's size and field offsets, every constant its
// value, and every function pointer of the dlsym table the type of the
// PFN_ typedef of the symbol version it resolves. Compiling is the check.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <nvml.h>
#include <stddef.h>
#include <stdint.h>

#define KV_ABI_CHECK 1
#include "../real_abi.h"

#define SAME_SIZE(kv, cu) _Static_assert(sizeof(kv) == sizeof(cu), #kv " is not the size of " #cu)
#define SAME_FIELD(kv, cu, f)                                                                   \
	_Static_assert(offsetof(kv, f) == offsetof(cu, f) &&                                        \
	                   sizeof(((kv *)0)->f) == sizeof(((cu *)0)->f),                             \
	               #kv "." #f " is not where " #cu "." #f " is, or not its size")

SAME_SIZE(kv_CUmemLocation, CUmemLocation);
SAME_FIELD(kv_CUmemLocation, CUmemLocation, type);
SAME_FIELD(kv_CUmemLocation, CUmemLocation, id);
SAME_SIZE(kv_CUmemcpyAttributes, CUmemcpyAttributes);
SAME_FIELD(kv_CUmemcpyAttributes, CUmemcpyAttributes, srcAccessOrder);
SAME_FIELD(kv_CUmemcpyAttributes, CUmemcpyAttributes, srcLocHint);
SAME_FIELD(kv_CUmemcpyAttributes, CUmemcpyAttributes, dstLocHint);
SAME_FIELD(kv_CUmemcpyAttributes, CUmemcpyAttributes, flags);
SAME_SIZE(kv_CUipcMemHandle, CUipcMemHandle);
SAME_FIELD(kv_CUipcMemHandle, CUipcMemHandle, reserved);

#define SAME_VALUE(name) _Static_assert((long long)KV_##name == (long long)(name), #name " is not cuda.h's")
SAME_VALUE(CU_MEM_LOCATION_TYPE_DEVICE);
SAME_VALUE(CU_MEM_LOCATION_TYPE_HOST);
SAME_VALUE(CU_MEMCPY_SRC_ACCESS_ORDER_STREAM);
SAME_VALUE(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
SAME_VALUE(CU_STREAM_NON_BLOCKING);
_Static_assert(KV_CU_STREAM_LEGACY == (uintptr_t)CU_STREAM_LEGACY, "CU_STREAM_LEGACY is not cuda.h's");
SAME_VALUE(CU_EVENT_DISABLE_TIMING);
SAME_VALUE(CU_MEMHOSTALLOC_PORTABLE);
SAME_VALUE(CU_MEMHOSTALLOC_DEVICEMAP);
SAME_VALUE(CU_MEMHOSTREGISTER_PORTABLE);
SAME_VALUE(CU_MEMHOSTREGISTER_DEVICEMAP);
SAME_VALUE(CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
SAME_VALUE(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
SAME_VALUE(CU_MEMORYTYPE_DEVICE);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM);
SAME_VALUE(CUDA_SUCCESS);
SAME_VALUE(CUDA_ERROR_INVALID_VALUE);
SAME_VALUE(CUDA_ERROR_OUT_OF_MEMORY);
SAME_VALUE(CUDA_ERROR_NOT_INITIALIZED);
SAME_VALUE(CUDA_ERROR_NO_DEVICE);
SAME_VALUE(CUDA_ERROR_INVALID_DEVICE);
SAME_VALUE(CUDA_ERROR_INVALID_CONTEXT);
SAME_VALUE(CUDA_ERROR_INVALID_HANDLE);
SAME_VALUE(CUDA_ERROR_NOT_READY);
SAME_VALUE(CUDA_ERROR_ILLEGAL_ADDRESS);
SAME_VALUE(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
SAME_VALUE(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
SAME_VALUE(CUDA_ERROR_NOT_SUPPORTED);
SAME_VALUE(CUDA_ERROR_UNKNOWN);

// The PFN_ typedef of the symbol version each exported name resolves
// (cuda.h maps the unversioned API names to the newest; dlsym takes the
// name as written). A symbol added to the table without its line here
// does not compile.
#define KV_PFN_cuGetErrorName PFN_cuGetErrorName_v6000
#define KV_PFN_cuGetErrorString PFN_cuGetErrorString_v6000
#define KV_PFN_cuInit PFN_cuInit_v2000
#define KV_PFN_cuDriverGetVersion PFN_cuDriverGetVersion_v2020
#define KV_PFN_cuDeviceGetCount PFN_cuDeviceGetCount_v2000
#define KV_PFN_cuDeviceGet PFN_cuDeviceGet_v2000
#define KV_PFN_cuDeviceGetName PFN_cuDeviceGetName_v2000
#define KV_PFN_cuDeviceTotalMem_v2 PFN_cuDeviceTotalMem_v3020
#define KV_PFN_cuDeviceGetAttribute PFN_cuDeviceGetAttribute_v2000
#define KV_PFN_cuDeviceGetPCIBusId PFN_cuDeviceGetPCIBusId_v4010
#define KV_PFN_cuDevicePrimaryCtxRetain PFN_cuDevicePrimaryCtxRetain_v7000
#define KV_PFN_cuDevicePrimaryCtxRelease_v2 PFN_cuDevicePrimaryCtxRelease_v11000
#define KV_PFN_cuCtxGetCurrent PFN_cuCtxGetCurrent_v4000
#define KV_PFN_cuCtxSetCurrent PFN_cuCtxSetCurrent_v4000
#define KV_PFN_cuStreamCreate PFN_cuStreamCreate_v2000
#define KV_PFN_cuStreamDestroy_v2 PFN_cuStreamDestroy_v4000
#define KV_PFN_cuStreamQuery PFN_cuStreamQuery_v2000
#define KV_PFN_cuStreamWaitEvent PFN_cuStreamWaitEvent_v3020
#define KV_PFN_cuStreamGetCtx PFN_cuStreamGetCtx_v9020
#define KV_PFN_cuEventCreate PFN_cuEventCreate_v2000
#define KV_PFN_cuEventDestroy_v2 PFN_cuEventDestroy_v4000
#define KV_PFN_cuEventRecord PFN_cuEventRecord_v2000
#define KV_PFN_cuEventQuery PFN_cuEventQuery_v2000
#define KV_PFN_cuMemcpyHtoDAsync_v2 PFN_cuMemcpyHtoDAsync_v3020
#define KV_PFN_cuMemcpyDtoHAsync_v2 PFN_cuMemcpyDtoHAsync_v3020
#define KV_PFN_cuMemcpyDtoDAsync_v2 PFN_cuMemcpyDtoDAsync_v3020
#define KV_PFN_cuMemAlloc_v2 PFN_cuMemAlloc_v3020
#define KV_PFN_cuMemFree_v2 PFN_cuMemFree_v3020
#define KV_PFN_cuMemHostAlloc PFN_cuMemHostAlloc_v2020
#define KV_PFN_cuMemFreeHost PFN_cuMemFreeHost_v2000
#define KV_PFN_cuMemHostRegister_v2 PFN_cuMemHostRegister_v6050
#define KV_PFN_cuMemHostUnregister PFN_cuMemHostUnregister_v4000
#define KV_PFN_cuPointerGetAttribute PFN_cuPointerGetAttribute_v4000
#define KV_PFN_cuModuleLoadData PFN_cuModuleLoadData_v2000
#define KV_PFN_cuModuleGetFunction PFN_cuModuleGetFunction_v2000
#define KV_PFN_cuModuleUnload PFN_cuModuleUnload_v2000
#define KV_PFN_cuLaunchKernel PFN_cuLaunchKernel_v4000
#define KV_PFN_cuMemcpyBatchAsync PFN_cuMemcpyBatchAsync_v12080
#define KV_PFN_cuMemGetAddressRange_v2 PFN_cuMemGetAddressRange_v3020
#define KV_PFN_cuIpcGetMemHandle PFN_cuIpcGetMemHandle_v4010
#define KV_PFN_cuIpcOpenMemHandle_v2 PFN_cuIpcOpenMemHandle_v11000
#define KV_PFN_cuIpcCloseMemHandle PFN_cuIpcCloseMemHandle_v4010
#if CUDA_VERSION >= 13000
#define KV_PFN_cuMemcpyBatchAsync_v2 PFN_cuMemcpyBatchAsync_v13000
#else
// CUDA 12's headers have no cuMemcpyBatchAsync_v2: its type as CUDA 13
// declares it, so that the 12.8 check still holds kvbm to it.
typedef CUresult(CUDAAPI *kv_pfn_batch_v2)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
                                           CUmemcpyAttributes *, size_t *, size_t, CUstream);
#define KV_PFN_cuMemcpyBatchAsync_v2 kv_pfn_batch_v2
#endif

#define SAME_TYPE(name, params)                                                                 \
	_Static_assert(__builtin_types_compatible_p(CUresult(CUDAAPI *) params, KV_PFN_##name),    \
	               #name " is not declared as its PFN_ typedef in cudaTypedefs.h");
CU_REQUIRED_SYMBOLS(SAME_TYPE)
CU_OPTIONAL_SYMBOLS(SAME_TYPE)

// NVML: the functions as nvml.h declares them (its versioned names).
SAME_SIZE(kv_nvmlMemory_t, nvmlMemory_t);
SAME_FIELD(kv_nvmlMemory_t, nvmlMemory_t, total);
SAME_FIELD(kv_nvmlMemory_t, nvmlMemory_t, free);
SAME_FIELD(kv_nvmlMemory_t, nvmlMemory_t, used);
#define SAME_NVML_TYPE(name, params)                                                            \
	_Static_assert(__builtin_types_compatible_p(nvmlReturn_t(*) params, __typeof__(&name)),   \
	               #name " is not declared as nvml.h declares it");
NV_REQUIRED_SYMBOLS(SAME_NVML_TYPE)
NV_OPTIONAL_SYMBOLS(SAME_NVML_TYPE)

int main(void) { return 0; }
