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
	"strings"
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
//     or device 0's for the legacy default stream and for events.
//   - Streams and events are raw CUstream / CUevent values; ones the engine
//     made (torch.cuda.Event().cuda_event, torch streams) are used as they
//     are, with no lookup in our tables.
//   - EventSynchronize and StreamSynchronize poll (cuEventQuery,
//     cuStreamQuery) with a backoff from 2 µs to 100 µs instead of blocking
//     an OS thread each.
//   - Errors are *Error with the driver's name and description. An error
//     of asynchronous work (an illegal address in a kernel) is sticky for
//     the whole context in CUDA, not per stream as in the emulated device.
type Real struct {
	devices []realDevice
	batchOK bool // cuMemcpyBatchAsync resolved and enabled (see EnvMemcpyBatch)
	numa    bool // more than one NUMA node: HostAlloc places pages near the device

	mu        sync.Mutex
	closed    bool
	devAllocs map[uint64]int          // MemAlloc: ptr → device
	hostAlloc map[uint64]int          // HostAlloc: ptr → device
	hostRegs  map[uint64][]span       // HostRegister: ptr → the chunks registered
	devRanges map[uint64]int          // RegisterDeviceRange: ptr → count
	hosts     regionTable             // pinned host ranges (HostAlloc and HostRegister), for the kernel path
	kernels   map[int]*copyKernel     // per device, loaded at first use
	kernelErr map[int]error           // per device, why the kernel is unavailable
	tables    map[int][]*kernelTables // per device, the kernel's argument tables
}

type realDevice struct {
	info    DeviceInfo
	ctx     uint64 // retained primary context
	hostPtr bool   // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: the kernel may touch pinned host memory
}

var _ Driver = (*Real)(nil)

// Library names, variables so that tests can point them elsewhere.
var (
	libcudaName = "libcuda.so.1"
	libnvmlName = "libnvidia-ml.so.1"
)

// EnvMemcpyBatch enables cuMemcpyBatchAsync for MemcpyBatchAsync when set to
// "1". Off by default until scripts/gpu-check.sh has passed with it on a GPU;
// without it, batches use the kernel or a loop of cuMemcpy*Async.
const EnvMemcpyBatch = "KVBM_CUDA_MEMCPY_BATCH"

// CUDA constants used here (cuda.h).
const (
	cuStreamNonBlocking        = 0x1
	cuEventDisableTiming       = 0x2
	cuMemHostAllocPortable     = 0x1
	cuMemHostAllocDeviceMap    = 0x2
	cuMemHostRegisterPortable  = 0x1
	cuMemHostRegisterDeviceMap = 0x2
	cuPointerAttrMemoryType    = 2
	cuPointerAttrDeviceOrdinal = 9
	cuMemoryTypeDevice         = 2
	cuAttrCanUseHostPointer    = 91 // CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
)

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
	path := C.CString(libcudaName)
	defer C.free(unsafe.Pointer(path))
	var buf [512]C.char
	if C.kv_cuda_load(path, &buf[0], C.size_t(len(buf))) != 0 {
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
		devAllocs: map[uint64]int{},
		hostAlloc: map[uint64]int{},
		hostRegs:  map[uint64][]span{},
		devRanges: map[uint64]int{},
		kernels:   map[int]*copyKernel{},
		kernelErr: map[int]error{},
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
	r.numa = numaNodes() > 1
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
		ctx:     uint64(ctx),
		hostPtr: hostPtr != 0,
	}, nil
}

// loadNVML opens libnvidia-ml.so.1 once per process.
func loadNVML() error {
	path := C.CString(libnvmlName)
	defer C.free(unsafe.Pointer(path))
	var buf [512]C.char
	if C.kv_nvml_load(path, &buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("cannot load %s: %s", libnvmlName, C.GoString(&buf[0]))
	}
	return nil
}

// numaNode is the NUMA node of the device at busID: NVML's answer when it
// has one, else sysfs's, else -1.
func numaNode(busID string, nvml bool) int {
	if nvml {
		id := C.CString(busID)
		defer C.free(unsafe.Pointer(id))
		var node C.int
		if C.kv_nvml_numa_node(id, &node) == 0 && node >= 0 {
			return int(node)
		}
	}
	return sysfsNUMANode(busID)
}

// Close releases the primary contexts. Memory, streams and events still
// allocated are not freed (the engine may share the context). Close is
// idempotent; later calls fail with CUDA_ERROR_NOT_INITIALIZED.
func (r *Real) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	var first error
	for i := range r.devices {
		if err := check("cuDevicePrimaryCtxRelease", C.kv_cuDevicePrimaryCtxRelease(C.int(i))); err != nil && first == nil {
			first = err
		}
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

// sysfsNUMANode reads /sys/bus/pci/devices/<bus id>/numa_node; -1 when
// unknown. cuDeviceGetPCIBusId gives "0000:3B:00.0"; sysfs spells it in
// lower case.
func sysfsNUMANode(busID string) int {
	b, err := os.ReadFile("/sys/bus/pci/devices/" + strings.ToLower(busID) + "/numa_node")
	if err != nil {
		return -1
	}
	var n int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &n); err != nil || n < 0 {
		return -1
	}
	return n
}

// numaNodes is the number of NUMA nodes of this machine (1 when unknown).
func numaNodes() int {
	n := 0
	for {
		if _, err := os.Stat(fmt.Sprintf("/sys/devices/system/node/node%d", n)); err != nil {
			break
		}
		n++
	}
	return max(n, 1)
}

// batchVersion reports which cuMemcpyBatchAsync the driver has (0 none,
// 1 CUDA 12.8's, 2 cuMemcpyBatchAsync_v2).
func batchVersion() int { return int(C.kv_cuda_batch_version()) }
