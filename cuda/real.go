//go:build cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "real_trampolines.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"unsafe"
)

// Real is the CUDA driver: libcuda.so.1 opened with dlopen at first use,
// every call made through a C trampoline over a dlsym'd function pointer
// (see real_trampolines.h). Nothing links against CUDA, so libkvbm.so loads
// on machines without a driver.
//
//   - Each device's primary context (the one PyTorch and the CUDA runtime
//     use) is retained at open; each call makes the right context current
//     on its OS thread inside the same C call: a created resource's device,
//     a stream's own context (cuStreamGetCtx, so an engine's streams work),
//     for the legacy and per-thread default streams the calling thread's
//     current context (CUDA's rule: an engine's thread has its device's),
//     and device 0's for events and where the thread has none.
//   - Streams and events are raw CUstream / CUevent values; ones the engine
//     made (torch.cuda.Event().cuda_event, torch streams) are used as they
//     are, with no lookup in our tables.
//   - Each trampoline puts the calling thread's previous current context
//     back before it returns (the thread may be the engine's).
//   - EventSynchronize and StreamSynchronize poll (cuEventQuery,
//     cuStreamQuery) instead of blocking an OS thread each: yielding for
//     the first 50 µs, then sleeping from 50 µs doubling to 1 ms.
//   - Errors are *Error with the driver's name and description. An error
//     of asynchronous work (an illegal address in a kernel) is sticky for
//     the whole context in CUDA, not per stream as in the emulated device.
type Real struct {
	devices []realDevice
	batchOK bool // cuMemcpyBatchAsync resolved and enabled (see EnvMemcpyBatch)
	numa    bool // more than one NUMA node: HostAlloc places pages near the device

	mu        sync.Mutex
	closed    bool
	devAllocs map[uint64]devRange     // MemAlloc: ptr → device and size
	hostAlloc map[uint64]int          // HostAlloc: ptr → device
	hostRegs  map[uint64][]span       // HostRegister: ptr → the chunks it pinned (not those adopted)
	adopted   map[uint64][]span       // HostRegister: ptr → the chunks it adopted (pinned by their owner, maybe in part)
	devRanges map[uint64][]devRange   // RegisterDeviceRange: ptr → its registrations, latest last
	ipcOpen   map[uint64]ipcOpened    // IPCOpen: ptr → device, size and opens
	devIndex  deviceRanges            // MemAlloc, RegisterDeviceRange and IPCOpen ranges per device, for the kernel path
	hosts     regionTable             // pinned host ranges (HostAlloc and HostRegister), for the kernel path
	kernels   map[int]*copyKernel     // per device, loaded at first use
	kernelErr map[int]error           // per device, why the kernel is unavailable
	kernelRes map[int]int             // per device, the CUresult that made it unavailable
	kernelLog bool                    // the kernel's unavailability has been logged
	tables    map[int][]*kernelTables // per device, the kernel's argument tables

	batchFallbackLog sync.Once // cuMemcpyBatchAsync refused a batch: logged once
}

type realDevice struct {
	info    DeviceInfo
	dev     int    // CUdevice from cuDeviceGet
	ctx     uint64 // retained primary context
	hostPtr bool   // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: the kernel may touch pinned host memory
}

var _ Driver = (*Real)(nil)

// Library names (the C side opens these; see real_trampolines.c).
const (
	libcudaName = "libcuda.so.1"
	libnvmlName = "libnvidia-ml.so.1"
)

// EnvMemcpyBatch enables cuMemcpyBatchAsync for MemcpyBatchAsync when set to
// "1". Off by default until scripts/gpu-check.sh has passed with it on a GPU;
// without it, batches use the kernel or a loop of cuMemcpy*Async.
const EnvMemcpyBatch = "KVBM_CUDA_MEMCPY_BATCH"

// EnvIPC enables CUDA IPC (IPCExport) when set to "1": off until checked on
// a GPU, so that peers on one host move device memory through pinned
// staging and the socket meanwhile. (CUDA leaves undefined an exporter
// freeing memory another process still has open; an importer keeps a
// layout open until it disconnects, imports again, or is told the layout
// is gone.)
const EnvIPC = "KVBM_CUDA_IPC"

// The CUDA constants used here are in real_abi.go (real_abi.h's).

// openCUDA opens the real driver for Open: an error when it cannot be
// loaded or initialized, or has no device.
func openCUDA() (Driver, error) {
	r, err := OpenReal()
	if err != nil {
		return nil, err
	}
	if len(r.devices) == 0 {
		_ = r.Close()
		return nil, NewError("cuDeviceGetCount", ErrCodeNoDevice, "the CUDA driver loaded but reports no device")
	}
	return r, nil
}

// loadLibcuda opens libcuda once per process.
func loadLibcuda() error {
	var buf [512]C.char
	if C.kv_cuda_load(&buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("%w: cannot load %s: %s", ErrCUDAUnavailable, libcudaName, C.GoString(&buf[0]))
	}
	return nil
}

// cuErrorText asks the loaded driver for a code's name and description.
func cuErrorText(code int) (string, string, bool) {
	var name, desc *C.char
	if C.kv_cuGetErrorName(C.int(code), &name) != 0 || name == nil {
		return "", "", false
	}
	if C.kv_cuGetErrorString(C.int(code), &desc) != 0 || desc == nil {
		return C.GoString(name), "", true
	}
	return C.GoString(name), C.GoString(desc), true
}

// check maps a CUresult from a trampoline.
func check(op string, r C.int) error { return resultError(op, int(r), cuErrorText) }

// OpenReal loads libcuda.so.1, initializes the driver and retains every
// device's primary context. It fails with an error wrapping
// ErrCUDAUnavailable when the library cannot be loaded, and with the
// driver's error when cuInit fails (CUDA_ERROR_NO_DEVICE on a machine with
// a driver and no GPU). Close releases the contexts.
func OpenReal() (*Real, error) {
	if err := loadLibcuda(); err != nil {
		return nil, err
	}
	if err := check("cuInit", C.kv_cuInit(0)); err != nil {
		return nil, err
	}
	var n C.int
	if err := check("cuDeviceGetCount", C.kv_cuDeviceGetCount(&n)); err != nil {
		return nil, err
	}
	r := &Real{
		devAllocs: map[uint64]devRange{},
		ipcOpen:   map[uint64]ipcOpened{},
		hostAlloc: map[uint64]int{},
		hostRegs:  map[uint64][]span{},
		adopted:   map[uint64][]span{},
		devRanges: map[uint64][]devRange{},
		kernels:   map[int]*copyKernel{},
		kernelErr: map[int]error{},
		kernelRes: map[int]int{},
		tables:    map[int][]*kernelTables{},
	}
	r.hosts.init("pinned host")
	nvml := loadNVML() == nil
	for i := range int(n) {
		d, err := openDevice(i, nvml)
		if err != nil {
			_ = r.Close()
			return nil, err
		}
		r.devices = append(r.devices, d)
	}
	r.batchOK = C.kv_cuda_batch_version() != 0 && os.Getenv(EnvMemcpyBatch) == "1"
	r.numa = numaNodes(sysfsRoot) > 1
	return r, nil
}

func openDevice(ordinal int, nvml bool) (realDevice, error) {
	var dev C.int
	if err := check("cuDeviceGet", C.kv_cuDeviceGet(&dev, C.int(ordinal))); err != nil {
		return realDevice{}, err
	}
	var name, bus [256]C.char
	if err := check("cuDeviceGetName", C.kv_cuDeviceGetName(&name[0], C.int(len(name)), dev)); err != nil {
		return realDevice{}, err
	}
	var total C.uint64_t
	if err := check("cuDeviceTotalMem", C.kv_cuDeviceTotalMem(&total, dev)); err != nil {
		return realDevice{}, err
	}
	if err := check("cuDeviceGetPCIBusId", C.kv_cuDeviceGetPCIBusId(&bus[0], C.int(len(bus)), dev)); err != nil {
		return realDevice{}, err
	}
	var hostPtr C.int
	if err := check("cuDeviceGetAttribute", C.kv_cuDeviceGetAttribute(&hostPtr, cuAttrCanUseHostPointer, dev)); err != nil {
		return realDevice{}, err
	}
	var ctx C.uint64_t
	if err := check("cuDevicePrimaryCtxRetain", C.kv_cuDevicePrimaryCtxRetain(&ctx, dev)); err != nil {
		return realDevice{}, err
	}
	busID := C.GoString(&bus[0])
	return realDevice{
		info: DeviceInfo{
			Ordinal:     ordinal,
			Name:        C.GoString(&name[0]),
			TotalMemory: uint64(total),
			PCIBusID:    busID,
			NUMANode:    numaNode(busID, nvml),
		},
		dev:     int(dev),
		ctx:     uint64(ctx),
		hostPtr: hostPtr != 0,
	}, nil
}

// loadNVML opens libnvidia-ml.so.1 once per process.
func loadNVML() error {
	var buf [512]C.char
	if C.kv_nvml_load(&buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("cannot load %s: %s", libnvmlName, C.GoString(&buf[0]))
	}
	return nil
}

// numaNode is the NUMA node of the device at busID (see deviceNUMANode:
// sysfs first, NVML as a fallback, only nodes with CPUs), or -1.
func numaNode(busID string, nvml bool) int {
	var fromNVML func() int
	if nvml {
		fromNVML = func() int {
			id := C.CString(busID)
			defer C.free(unsafe.Pointer(id))
			var node C.int
			if C.kv_nvml_numa_node(id, &node) != 0 {
				return -1
			}
			return int(node)
		}
	}
	return deviceNUMANode(sysfsRoot, busID, fromNVML)
}

// Close frees the copy kernel's tables (after the launches using them have
// finished), unloads the kernel modules, then releases the primary
// contexts. Memory, streams and events the caller still holds are not
// freed (the engine may share the context). Close is idempotent; later
// calls fail with CUDA_ERROR_NOT_INITIALIZED. It returns the first error.
func (r *Real) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for dev, sets := range r.tables {
		ctx := C.uint64_t(r.devices[dev].ctx)
		for _, t := range sets {
			if t.inFlight {
				// Its last launch may still read the tables. A failure here
				// is the context's sticky error: the work is over either way.
				_ = poll(func() (bool, error) {
					return done("cuEventQuery", C.kv_cuEventQuery(ctx, C.uint64_t(t.event)))
				})
			}
			keep(check("cuEventDestroy", C.kv_cuEventDestroy(ctx, C.uint64_t(t.event))))
			keep(check("cuMemFree", C.kv_cuMemFree(ctx, C.uint64_t(t.dev))))
			keep(check("cuMemFreeHost", C.kv_cuMemFreeHost(ctx, C.uint64_t(t.host))))
		}
	}
	clear(r.tables)
	for dev, k := range r.kernels {
		keep(check("cuModuleUnload", C.kv_cuModuleUnload(C.uint64_t(r.devices[dev].ctx), C.uint64_t(k.module))))
	}
	clear(r.kernels)
	for i := range r.devices {
		keep(check("cuDevicePrimaryCtxRelease", C.kv_cuDevicePrimaryCtxRelease(C.int(r.devices[i].dev))))
	}
	return first
}

// Name returns "cuda".
func (r *Real) Name() string { return RealName }

// DeviceCount is the number of CUDA devices (as CUDA_VISIBLE_DEVICES shows them).
func (r *Real) DeviceCount() (int, error) {
	if err := r.checkOpen("cuDeviceGetCount"); err != nil {
		return 0, err
	}
	return len(r.devices), nil
}

// Device describes a device; NUMANode comes from NVML or sysfs.
func (r *Real) Device(ordinal int) (DeviceInfo, error) {
	d, err := r.device("cuDeviceGet", ordinal)
	if err != nil {
		return DeviceInfo{}, err
	}
	return d.info, nil
}

func (r *Real) checkOpen(op string) error {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return NewError(op, ErrCodeNotInitialized, "the CUDA driver is closed")
	}
	return nil
}

func (r *Real) device(op string, ordinal int) (*realDevice, error) {
	if err := r.checkOpen(op); err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= len(r.devices) {
		return nil, NewError(op, ErrCodeInvalidDevice, fmt.Sprintf(
			"device ordinal %d out of range: the CUDA driver has %d device(s)", ordinal, len(r.devices)))
	}
	return &r.devices[ordinal], nil
}

// anyCtx is the context used where the call's own is unknown (the legacy
// default stream, events): device 0's primary context.
func (r *Real) anyCtx() C.uint64_t {
	if len(r.devices) == 0 {
		return 0
	}
	return C.uint64_t(r.devices[0].ctx)
}

// batchVersion reports which cuMemcpyBatchAsync the driver has (0 none,
// 1 CUDA 12.8's, 2 cuMemcpyBatchAsync_v2).
func batchVersion() int { return int(C.kv_cuda_batch_version()) }

// realCtxGetCurrent is this OS thread's current context (0 when none); for
// tests, which lock the goroutine to its thread.
func realCtxGetCurrent() (uint64, error) {
	var ctx C.uint64_t
	err := check("cuCtxGetCurrent", C.kv_cuCtxGetCurrent(&ctx))
	return uint64(ctx), err
}

// realCtxSetCurrent makes ctx this OS thread's current context, as an
// engine's CUDA runtime would; for tests, which lock the goroutine to its
// thread.
func realCtxSetCurrent(ctx uint64) error {
	return check("cuCtxSetCurrent", C.kv_cuCtxSetCurrent(C.uint64_t(ctx)))
}

// realEnginePin pins [ptr, ptr+size) as an engine would (cudaHostRegister),
// outside this driver's bookkeeping; for tests.
func realEnginePin(r *Real, ptr, size uint64, pin bool) error {
	if pin {
		return check("cuMemHostRegister", C.kv_cuMemHostRegister(r.anyCtx(), C.uint64_t(ptr), C.uint64_t(size),
			cuMemHostRegisterPortable|cuMemHostRegisterDeviceMap))
	}
	return check("cuMemHostUnregister", C.kv_cuMemHostUnregister(r.anyCtx(), C.uint64_t(ptr)))
}
