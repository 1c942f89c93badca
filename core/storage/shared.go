package storage

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/hugepage"
	"github.com/kvbm/kvbm/internal/memavail"
	"github.com/kvbm/kvbm/internal/memfd"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Shared host memory: a sealed memory file (internal/memfd) mapped
// MAP_SHARED, so that a peer process on this host that is handed the file
// (over a Unix socket) maps the same pages and copies them with plain loads
// and stores, without a socket or a kernel copy in between.

// ErrNotShareable is returned where this kernel cannot make shared memory
// files (no memfd_create, or a sandbox that forbids it); callers fall
// back to private memory.
var ErrNotShareable = kvbmerr.New(kvbmerr.Unsupported, "shared host memory is not available here")

// AllocShared allocates size bytes of zeroed host memory other processes
// of this host can map (File). With pinned it is also pinned for device's
// copies (kind Pinned) and placed on the device's NUMA node where known, as
// HostAlloc's is; otherwise it is pageable (kind System).
func AllocShared(drv cuda.Driver, device int, size uint64, pinned bool) (*Memory, error) {
	if size == 0 {
		return nil, fmt.Errorf("allocate shared host memory: size must be > 0")
	}
	// Every page is made resident below: refuse what cannot fit before
	// one is touched, with the out of memory cuMemHostAlloc would give.
	release, err := memavail.Reserve(size)
	if err != nil {
		return nil, outOfMemory("allocate shared host memory", err)
	}
	defer release()
	f, err := memfd.New("kvbm", size)
	if errors.Is(err, memfd.ErrUnavailable) {
		return nil, fmt.Errorf("%w: %w", ErrNotShareable, err)
	}
	if err != nil {
		return nil, fmt.Errorf("allocate %d bytes of shared host memory: %w", size, err)
	}
	fail := func(what string, err error) (*Memory, error) {
		f.Close()
		return nil, fmt.Errorf("allocate %d bytes of shared host memory: %s: %w", size, what, err)
	}
	b, err := hugepage.Map(size, int(f.Fd()))
	if err != nil {
		return fail("mmap", err)
	}
	node := -1
	if pinned {
		if info, err := drv.Device(device); err == nil {
			node = info.NUMANode
		}
	}
	if err := populate(b, node); err != nil {
		_ = hugepage.Unmap(b)
		f.Close()
		op := fmt.Sprintf("allocate %d bytes of shared host memory", size)
		if errors.Is(err, unix.ENOMEM) {
			return nil, outOfMemory(op, err)
		}
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	m := &Memory{kind: System, device: -1, addr: addrOf(b), size: size, file: f}
	unmap := func() error { return errors.Join(hugepage.Unmap(b), f.Close()) }
	m.release = unmap
	if pinned {
		if err := drv.HostRegister(m.addr, size); err != nil {
			// Not shareable pinned memory here (a driver that refuses to
			// pin shared pages): the caller falls back to private memory.
			return nil, errors.Join(fmt.Errorf("%w: pin %d bytes of shared host memory: %w", ErrNotShareable, size, err), unmap())
		}
		m.kind, m.device = Pinned, device
		m.release = func() error { return errors.Join(drv.HostUnregister(m.addr), unmap()) }
	}
	return m, nil
}

// outOfMemory is err, host memory that could not be made resident (a
// memavail refusal, ENOMEM), as the driver's out of memory: what
// cuMemHostAlloc gives for pinned memory (a KVBM_ERR_CUDA through the C
// ABI). It still wraps err: errors.Is(…, memavail.ErrInsufficient) and
// errors.Is(…, syscall.ENOMEM) hold.
func outOfMemory(op string, err error) error {
	return &hostOutOfMemory{drv: cuda.NewError(op, cuda.ErrCodeOutOfMemory, err.Error()), cause: err}
}

// hostOutOfMemory is a *cuda.Error (its message and kind, CUDA) that also
// wraps the refusal it stands for.
type hostOutOfMemory struct {
	drv   *cuda.Error
	cause error
}

func (e *hostOutOfMemory) Error() string      { return e.drv.Error() }
func (e *hostOutOfMemory) Kind() kvbmerr.Kind { return e.drv.Kind() }
func (e *hostOutOfMemory) Unwrap() []error    { return []error{e.drv, e.cause} }

// populate is populateResident; tests make it fail.
var populate = populateResident

// populateResident makes every page resident now, as cuMemHostAlloc does, so that
// no copy into the memory later takes page faults: on NUMA node node when
// it is known (mbind MPOL_PREFERRED before the pages exist), as huge pages
// where the kernel gives them (hugepage.Populate).
func populateResident(b []byte, node int) error {
	if node >= 0 && node < 64 {
		mask := uint64(1) << node
		_, _, _ = unix.Syscall6(unix.SYS_MBIND, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
			unix.MPOL_PREFERRED, uintptr(unsafe.Pointer(&mask)), 64, 0) // a hint: without it the pages still work
	}
	return hugepage.Populate(b, true)
}

// File is the memory's shared memory file, for a peer process to map; nil
// for memory that is not shared.
func (m *Memory) File() *os.File { return m.file }

// Mapping is a peer's shared memory mapped into this process.
type Mapping struct {
	b []byte
}

// MapShared maps size bytes of a shared memory file a peer handed over. The
// file must carry the seals AllocShared gives it (so that it cannot shrink
// under the mapping) and be exactly size bytes.
func MapShared(f *os.File, size uint64) (*Mapping, error) {
	if _, err := memfd.Check(f, size); err != nil {
		return nil, fmt.Errorf("map shared memory: %w", err)
	}
	b, err := hugepage.Map(size, int(f.Fd())) // aligned, so that the peer's huge pages map whole
	if err != nil {
		return nil, fmt.Errorf("map shared memory of %d bytes: %w", size, err)
	}
	return &Mapping{b: b}, nil
}

// Bytes is the mapped memory.
func (m *Mapping) Bytes() []byte { return m.b }

// Close unmaps the memory; nothing may use Bytes after it.
func (m *Mapping) Close() error {
	if m.b == nil {
		return nil
	}
	err := hugepage.Unmap(m.b)
	m.b = nil
	return err
}
