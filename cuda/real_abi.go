//go:build cgo

package cuda

/*
#include "real_abi.h"
*/
import "C"

// The Go side's CUDA constants are real_abi.h's, which make test-cuda-abi
// checks against cuda.h: each pair below is equal, or this file does not
// compile (an array length that is negative one way or the other).
var (
	_ [ErrCodeInvalidValue - C.KV_CUDA_ERROR_INVALID_VALUE]struct{}
	_ [C.KV_CUDA_ERROR_INVALID_VALUE - ErrCodeInvalidValue]struct{}
	_ [ErrCodeOutOfMemory - C.KV_CUDA_ERROR_OUT_OF_MEMORY]struct{}
	_ [C.KV_CUDA_ERROR_OUT_OF_MEMORY - ErrCodeOutOfMemory]struct{}
	_ [ErrCodeNotInitialized - C.KV_CUDA_ERROR_NOT_INITIALIZED]struct{}
	_ [C.KV_CUDA_ERROR_NOT_INITIALIZED - ErrCodeNotInitialized]struct{}
	_ [ErrCodeNoDevice - C.KV_CUDA_ERROR_NO_DEVICE]struct{}
	_ [C.KV_CUDA_ERROR_NO_DEVICE - ErrCodeNoDevice]struct{}
	_ [ErrCodeInvalidDevice - C.KV_CUDA_ERROR_INVALID_DEVICE]struct{}
	_ [C.KV_CUDA_ERROR_INVALID_DEVICE - ErrCodeInvalidDevice]struct{}
	_ [ErrCodeInvalidContext - C.KV_CUDA_ERROR_INVALID_CONTEXT]struct{}
	_ [C.KV_CUDA_ERROR_INVALID_CONTEXT - ErrCodeInvalidContext]struct{}
	_ [ErrCodeInvalidHandle - C.KV_CUDA_ERROR_INVALID_HANDLE]struct{}
	_ [C.KV_CUDA_ERROR_INVALID_HANDLE - ErrCodeInvalidHandle]struct{}
	_ [ErrCodeNotReady - C.KV_CUDA_ERROR_NOT_READY]struct{}
	_ [C.KV_CUDA_ERROR_NOT_READY - ErrCodeNotReady]struct{}
	_ [ErrCodeIllegalAddress - C.KV_CUDA_ERROR_ILLEGAL_ADDRESS]struct{}
	_ [C.KV_CUDA_ERROR_ILLEGAL_ADDRESS - ErrCodeIllegalAddress]struct{}
	_ [ErrCodeHostMemoryAlreadyRegistered - C.KV_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED]struct{}
	_ [C.KV_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED - ErrCodeHostMemoryAlreadyRegistered]struct{}
	_ [ErrCodeHostMemoryNotRegistered - C.KV_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED]struct{}
	_ [C.KV_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED - ErrCodeHostMemoryNotRegistered]struct{}
	_ [ErrCodeNotSupported - C.KV_CUDA_ERROR_NOT_SUPPORTED]struct{}
	_ [C.KV_CUDA_ERROR_NOT_SUPPORTED - ErrCodeNotSupported]struct{}
	_ [ErrCodeUnknown - C.KV_CUDA_ERROR_UNKNOWN]struct{}
	_ [C.KV_CUDA_ERROR_UNKNOWN - ErrCodeUnknown]struct{}
)

// The flags and attributes real.go passes to the driver.
const (
	cuStreamNonBlocking        = C.KV_CU_STREAM_NON_BLOCKING
	cuStreamLegacy             = C.KV_CU_STREAM_LEGACY // the legacy default stream, as 0 is
	cuEventDisableTiming       = C.KV_CU_EVENT_DISABLE_TIMING
	cuMemHostAllocPortable     = C.KV_CU_MEMHOSTALLOC_PORTABLE
	cuMemHostAllocDeviceMap    = C.KV_CU_MEMHOSTALLOC_DEVICEMAP
	cuMemHostRegisterPortable  = C.KV_CU_MEMHOSTREGISTER_PORTABLE
	cuMemHostRegisterDeviceMap = C.KV_CU_MEMHOSTREGISTER_DEVICEMAP
	cuPointerAttrMemoryType    = C.KV_CU_POINTER_ATTRIBUTE_MEMORY_TYPE
	cuPointerAttrDeviceOrdinal = C.KV_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
	cuMemoryTypeDevice         = C.KV_CU_MEMORYTYPE_DEVICE
	cuAttrCanUseHostPointer    = C.KV_CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
)
