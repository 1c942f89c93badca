// Package cuda is the one door through which device work happens: streams,
// events, async and batched copies, pinned host memory and device memory.
//
// Two drivers implement it: the real CUDA driver (libcuda.so.1 opened with
// dlopen at first use; nothing links against CUDA at build time) and the
// emulated device, where device memory is host memory and each stream is an
// ordered queue run by one goroutine. Callers never know which one they have.
//
// Streams and events are the driver's raw handles (a CUstream / CUevent for
// the real driver), so an engine's own events — torch.cuda.Event().cuda_event
// — cross the C ABI unchanged.
package cuda

import (
	"errors"
	"fmt"

	"github.com/kvbm/kvbm/kvbmerr"
)

// Stream is a raw stream handle (CUstream). Zero is the legacy default stream.
type Stream uintptr

// Event is a raw event handle (CUevent).
type Event uintptr

// CopyKind is the direction of a copy.
type CopyKind uint8

const (
	// HostToDevice copies from pinned host memory to device memory.
	HostToDevice CopyKind = iota + 1
	// DeviceToHost copies from device memory to pinned host memory.
	DeviceToHost
	// DeviceToDevice copies between device allocations.
	DeviceToDevice
)

func (k CopyKind) String() string {
	switch k {
	case HostToDevice:
		return "H2D"
	case DeviceToHost:
		return "D2H"
	case DeviceToDevice:
		return "D2D"
	}
	return fmt.Sprintf("CopyKind(%d)", uint8(k))
}

// Copy is one contiguous copy of Size bytes from Src to Dst.
type Copy struct {
	Dst, Src uint64
	Size     uint64
}

// DeviceInfo describes one device.
type DeviceInfo struct {
	Ordinal     int
	Name        string
	TotalMemory uint64
	PCIBusID    string
	NUMANode    int // -1 when unknown
}

// Driver is the device interface. All methods are safe for concurrent use.
//
// Asynchronous semantics follow CUDA: work enqueued on one stream runs in
// order; an event is complete when the work recorded before it on its stream
// is complete; querying or waiting on an event that was never recorded
// returns complete at once; StreamWaitEvent makes later work on the stream
// wait for the work captured by the event's most recent record at the time
// of the call.
type Driver interface {
	// Name is "cuda" or "emulated".
	Name() string
	// DeviceCount is the number of usable devices.
	DeviceCount() (int, error)
	// Device describes device ordinal.
	Device(ordinal int) (DeviceInfo, error)

	// StreamCreate makes a non-blocking stream on a device.
	StreamCreate(device int) (Stream, error)
	// StreamDestroy releases a stream after its queued work completes.
	StreamDestroy(s Stream) error
	// StreamSynchronize blocks until all work queued on s is complete, and
	// returns the first error that work met.
	StreamSynchronize(s Stream) error
	// StreamWaitEvent makes work queued later on s wait for e.
	StreamWaitEvent(s Stream, e Event) error

	// EventCreate makes an event on a device (timing disabled).
	EventCreate(device int) (Event, error)
	// EventDestroy releases an event.
	EventDestroy(e Event) error
	// EventRecord captures the work queued on s so far.
	EventRecord(e Event, s Stream) error
	// EventQuery reports whether the captured work is complete; a failure of
	// that work is returned as the error.
	EventQuery(e Event) (bool, error)
	// EventSynchronize blocks until the captured work is complete.
	EventSynchronize(e Event) error

	// MemcpyAsync enqueues one copy on s.
	MemcpyAsync(kind CopyKind, c Copy, s Stream) error
	// MemcpyBatchAsync enqueues many copies of one kind on s, in order.
	MemcpyBatchAsync(kind CopyKind, copies []Copy, s Stream) error

	// HostAlloc allocates size bytes of pinned host memory, accessible to
	// the device, on the NUMA node nearest to device where known.
	HostAlloc(device int, size uint64) (uint64, error)
	// HostFree releases memory from HostAlloc.
	HostFree(ptr uint64) error
	// HostRegister pins existing host memory for device copies.
	HostRegister(ptr, size uint64) error
	// HostUnregister undoes HostRegister.
	HostUnregister(ptr uint64) error

	// MemAlloc allocates device memory.
	MemAlloc(device int, size uint64) (uint64, error)
	// MemFree releases memory from MemAlloc.
	MemFree(ptr uint64) error
	// RegisterDeviceRange declares memory the engine allocated (its KV cache
	// tensors) as a device range kvbm may copy to and from. The real driver
	// checks that the range is device memory; the emulated device adopts
	// the host range as device memory.
	RegisterDeviceRange(device int, ptr, size uint64) error
	// UnregisterDeviceRange undoes RegisterDeviceRange.
	UnregisterDeviceRange(ptr uint64) error

	// IPCExport names the device allocation that holds [ptr, ptr+size) for
	// another process of this host (cuMemGetAddressRange,
	// cuIpcGetMemHandle): its handle, and the allocation's base and size.
	// Memory that is not one such allocation fails.
	IPCExport(ptr, size uint64) (h IPCHandle, base, allocSize uint64, err error)
	// IPCOpen maps an allocation another process exported into this one,
	// on device (cuIpcOpenMemHandle, peer access enabled lazily): device
	// memory for copies at the returned address, of the returned size,
	// until IPCClose. Opening a handle that is open already returns the
	// same address; each open is closed once. A handle this process
	// exported cannot be opened here.
	IPCOpen(device int, h IPCHandle) (addr, size uint64, err error)
	// IPCClose undoes one IPCOpen; the last unmaps the memory.
	IPCClose(ptr uint64) error
}

// IPCHandle names device memory for another process of the host: CUDA's
// CUipcMemHandle, 64 opaque bytes.
type IPCHandle [64]byte

// Error is a driver failure: the CUresult code with its name and text.
type Error struct {
	Op   string // the driver call, e.g. "cuMemcpyHtoDAsync"
	Code int    // CUresult
	Name string // e.g. "CUDA_ERROR_INVALID_VALUE"
	Desc string // the driver's description
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%d): %s", e.Op, e.Name, e.Code, e.Desc)
}

// Kind is CUDA: whatever the code, the driver failed.
func (e *Error) Kind() kvbmerr.Kind { return kvbmerr.CUDA }

// CUresult codes used by both drivers.
const (
	ErrCodeInvalidValue                = 1
	ErrCodeOutOfMemory                 = 2
	ErrCodeNotInitialized              = 3
	ErrCodeNoDevice                    = 100
	ErrCodeInvalidDevice               = 101
	ErrCodeInvalidContext              = 201
	ErrCodeInvalidHandle               = 400
	ErrCodeNotReady                    = 600
	ErrCodeIllegalAddress              = 700
	ErrCodeHostMemoryAlreadyRegistered = 712
	ErrCodeHostMemoryNotRegistered     = 713
	ErrCodeNotSupported                = 801
	ErrCodeUnknown                     = 999
)

var codeNames = map[int]string{
	ErrCodeInvalidValue:                "CUDA_ERROR_INVALID_VALUE",
	ErrCodeOutOfMemory:                 "CUDA_ERROR_OUT_OF_MEMORY",
	ErrCodeNotInitialized:              "CUDA_ERROR_NOT_INITIALIZED",
	ErrCodeNoDevice:                    "CUDA_ERROR_NO_DEVICE",
	ErrCodeInvalidDevice:               "CUDA_ERROR_INVALID_DEVICE",
	ErrCodeInvalidContext:              "CUDA_ERROR_INVALID_CONTEXT",
	ErrCodeInvalidHandle:               "CUDA_ERROR_INVALID_HANDLE",
	ErrCodeNotReady:                    "CUDA_ERROR_NOT_READY",
	ErrCodeIllegalAddress:              "CUDA_ERROR_ILLEGAL_ADDRESS",
	ErrCodeHostMemoryAlreadyRegistered: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	ErrCodeHostMemoryNotRegistered:     "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	ErrCodeNotSupported:                "CUDA_ERROR_NOT_SUPPORTED",
	ErrCodeUnknown:                     "CUDA_ERROR_UNKNOWN",
}

// NewError makes an Error for a code, filling in the code's name.
func NewError(op string, code int, desc string) *Error {
	name, ok := codeNames[code]
	if !ok {
		name = fmt.Sprintf("CUDA_ERROR_%d", code)
	}
	return &Error{Op: op, Code: code, Name: name, Desc: desc}
}

// IsCode reports whether err is a driver Error with the given code.
func IsCode(err error, code int) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}
