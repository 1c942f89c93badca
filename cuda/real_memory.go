//go:build cgo

package cuda

/*
#include "real_trampolines.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/kvbm/kvbm/internal/memavail"
)

// Memory of the real driver: device allocations, pinned host memory
// (allocated or registered), and the engine's device ranges.

// MemAlloc allocates device memory in device's primary context.
func (r *Real) MemAlloc(device int, size uint64) (uint64, error) {
	const op = "cuMemAlloc"
	d, err := r.device(op, device)
	if err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, NewError(op, ErrCodeInvalidValue, "size must be > 0")
	}
	var p C.uint64_t
	if err := check(op, C.kv_cuMemAlloc(C.uint64_t(d.ctx), &p, C.uint64_t(size))); err != nil {
		return 0, err
	}
	r.mu.Lock()
	a := devRange{dev: device, start: uint64(p), size: size}
	r.devAllocs[a.start] = a
	r.devIndex.add(a.dev, a.start, a.size)
	r.mu.Unlock()
	return uint64(p), nil
}

// MemFree releases memory from MemAlloc; ptr must be what it returned.
func (r *Real) MemFree(ptr uint64) error {
	const op = "cuMemFree"
	r.mu.Lock()
	a, ok := r.devAllocs[ptr]
	if ok {
		delete(r.devAllocs, ptr)
		r.devIndex.remove(a.dev, a.start, a.size)
	}
	r.mu.Unlock()
	if !ok {
		return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("%#x is not the start of a device allocation", ptr))
	}
	return check(op, C.kv_cuMemFree(C.uint64_t(r.devices[a.dev].ctx), C.uint64_t(ptr)))
}

// HostAlloc allocates pinned host memory with cuMemHostAlloc
// (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP). When the machine
// has several NUMA nodes and the device's is known, the pages are placed on
// that node (set_mempolicy(MPOL_PREFERRED) on the calling thread for the
// duration of the call).
func (r *Real) HostAlloc(device int, size uint64) (uint64, error) {
	const op = "cuMemHostAlloc"
	d, err := r.device(op, device)
	if err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, NewError(op, ErrCodeInvalidValue, "size must be > 0")
	}
	// The driver pins every page: beyond what the host holds that meets
	// the OOM killer rather than failing, so refuse it first.
	release, err := memavail.Reserve(size)
	if err != nil {
		return 0, NewError(op, ErrCodeOutOfMemory, fmt.Sprintf("pinned host memory: %v", err))
	}
	defer release()
	node := -1
	if r.numa {
		node = d.info.NUMANode
	}
	var p C.uint64_t
	if err := check(op, C.kv_cuMemHostAlloc(C.uint64_t(d.ctx), &p, C.uint64_t(size),
		cuMemHostAllocPortable|cuMemHostAllocDeviceMap, C.int(node))); err != nil {
		return 0, err
	}
	if err := r.hosts.register(op, regionHostAlloc, device, uint64(p), size, ErrCodeHostMemoryAlreadyRegistered); err != nil {
		_ = C.kv_cuMemFreeHost(C.uint64_t(d.ctx), p)
		return 0, err
	}
	r.mu.Lock()
	r.hostAlloc[uint64(p)] = device
	r.mu.Unlock()
	return uint64(p), nil
}

// HostFree releases memory from HostAlloc.
func (r *Real) HostFree(ptr uint64) error {
	const op = "cuMemFreeHost"
	r.mu.Lock()
	device, ok := r.hostAlloc[ptr]
	if ok {
		delete(r.hostAlloc, ptr)
	}
	r.mu.Unlock()
	if !ok {
		return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("%#x is not the start of a pinned host allocation", ptr))
	}
	if err := r.hosts.unregister(op, regionHostAlloc, ptr, ErrCodeInvalidValue); err != nil {
		return err
	}
	return check(op, C.kv_cuMemFreeHost(C.uint64_t(r.devices[device].ctx), C.uint64_t(ptr)))
}

// HostRegister pins [ptr, ptr+size) with cuMemHostRegister
// (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP), in chunks
// of at most 64 GiB. A chunk CUDA says is pinned already (by its owner) is
// used as it is, by the copy engines only (its owner may have pinned part
// of it: see kernelMayCopy). If a chunk fails, the chunks before it are unregistered
// again and the error names the chunk.
func (r *Real) HostRegister(ptr, size uint64) error {
	const op = "cuMemHostRegister"
	if err := r.checkOpen(op); err != nil {
		return err
	}
	if ptr == 0 || size == 0 {
		return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("pointer %#x and size %d must be non-zero", ptr, size))
	}
	ctx := r.anyCtx()
	// ours are the chunks this call pinned; a chunk its owner had pinned
	// already (cudaHostRegister, as engines do for their host KV pools:
	// CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) is adopted as it is and
	// left pinned at HostUnregister.
	var ours, adopted []span
	for i, c := range hostRegisterChunks(ptr, size, hostRegisterChunkMax) {
		err := check(op, C.kv_cuMemHostRegister(ctx, C.uint64_t(c.Start), C.uint64_t(c.Size),
			cuMemHostRegisterPortable|cuMemHostRegisterDeviceMap))
		var ce *Error
		if errors.As(err, &ce) && ce.Code == ErrCodeHostMemoryAlreadyRegistered {
			adopted = append(adopted, c)
			continue
		}
		if err != nil {
			for _, done := range ours {
				_ = C.kv_cuMemHostUnregister(ctx, C.uint64_t(done.Start))
			}
			return fmt.Errorf("register host range %#x+%d, chunk %d (%#x+%d): %w",
				ptr, size, i+1, c.Start, c.Size, err)
		}
		ours = append(ours, c)
	}
	if err := r.hosts.register(op, regionHostRegistered, -1, ptr, size, ErrCodeHostMemoryAlreadyRegistered); err != nil {
		for _, c := range ours {
			_ = C.kv_cuMemHostUnregister(ctx, C.uint64_t(c.Start))
		}
		return err
	}
	r.mu.Lock()
	r.hostRegs[ptr] = ours
	if len(adopted) > 0 {
		r.adopted[ptr] = adopted
	}
	r.mu.Unlock()
	return nil
}

// HostUnregister undoes HostRegister (every chunk); ptr must be the
// registered start.
func (r *Real) HostUnregister(ptr uint64) error {
	const op = "cuMemHostUnregister"
	r.mu.Lock()
	chunks, ok := r.hostRegs[ptr]
	if ok {
		delete(r.hostRegs, ptr)
		delete(r.adopted, ptr)
	}
	r.mu.Unlock()
	if !ok {
		return NewError(op, ErrCodeHostMemoryNotRegistered, fmt.Sprintf("%#x is not the start of a registered host range", ptr))
	}
	errs := []error{r.hosts.unregister(op, regionHostRegistered, ptr, ErrCodeHostMemoryNotRegistered)}
	for _, c := range chunks {
		errs = append(errs, check(op, C.kv_cuMemHostUnregister(r.anyCtx(), C.uint64_t(c.Start))))
	}
	return errors.Join(errs...)
}

// RegisterDeviceRange checks that [ptr, ptr+size) is device memory of
// device (cuPointerGetAttribute: MEMORY_TYPE is device and DEVICE_ORDINAL
// is device, at both ends) and records the registration, so that the copy
// kernel may touch the range; nothing else is needed for the copy engines
// to copy to and from it.
func (r *Real) RegisterDeviceRange(device int, ptr, size uint64) error {
	const op = "RegisterDeviceRange"
	d, err := r.device(op, device)
	if err != nil {
		return err
	}
	if ptr == 0 || size == 0 || ptr+size < ptr {
		return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("range %#x+%d is empty or wraps", ptr, size))
	}
	for _, p := range []uint64{ptr, ptr + size - 1} {
		var memType, ordinal C.uint
		if err := check("cuPointerGetAttribute", C.kv_cuPointerGetAttribute(C.uint64_t(d.ctx),
			unsafe.Pointer(&memType), cuPointerAttrMemoryType, C.uint64_t(p))); err != nil {
			return fmt.Errorf("%s: %#x (of range %#x+%d) is not memory the driver knows: %w", op, p, ptr, size, err)
		}
		if memType != cuMemoryTypeDevice {
			return NewError(op, ErrCodeInvalidValue, fmt.Sprintf(
				"%#x (of range %#x+%d) is not device memory (CUmemorytype %d)", p, ptr, size, memType))
		}
		if err := check("cuPointerGetAttribute", C.kv_cuPointerGetAttribute(C.uint64_t(d.ctx),
			unsafe.Pointer(&ordinal), cuPointerAttrDeviceOrdinal, C.uint64_t(p))); err != nil {
			return err
		}
		if int(ordinal) != device {
			return NewError(op, ErrCodeInvalidValue, fmt.Sprintf(
				"range %#x+%d is memory of device %d, not %d", ptr, size, ordinal, device))
		}
	}
	r.mu.Lock()
	reg := devRange{dev: device, start: ptr, size: size}
	r.devRanges[ptr] = append(r.devRanges[ptr], reg)
	r.devIndex.add(reg.dev, reg.start, reg.size)
	r.mu.Unlock()
	return nil
}

// UnregisterDeviceRange undoes the latest RegisterDeviceRange at ptr.
func (r *Real) UnregisterDeviceRange(ptr uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	regs := r.devRanges[ptr]
	if len(regs) == 0 {
		return NewError("UnregisterDeviceRange", ErrCodeInvalidValue,
			fmt.Sprintf("%#x is not the start of a registered device range", ptr))
	}
	reg := regs[len(regs)-1]
	if len(regs) == 1 {
		delete(r.devRanges, ptr)
	} else {
		r.devRanges[ptr] = regs[:len(regs)-1]
	}
	r.devIndex.remove(reg.dev, reg.start, reg.size)
	return nil
}
