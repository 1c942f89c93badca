package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvbm/kvbm/internal/hugepage"
	"github.com/kvbm/kvbm/internal/memavail"
)

// A region table is the set of address ranges a driver knows as one kind of
// memory. The emulated device keeps two (device memory, pinned host memory)
// and checks every copy against them; the real driver keeps one of pinned
// host ranges, for the copy kernel's path.

type regionKind uint8

const (
	regionDeviceAlloc      regionKind = iota + 1 // MemAlloc
	regionDeviceRegistered                       // RegisterDeviceRange
	regionHostAlloc                              // HostAlloc
	regionHostRegistered                         // HostRegister
	regionDeviceIPC                              // IPCOpen: another process's MemAlloc
)

// region is one range [start, end) of a table. mem is the mapping for
// allocations (nil for registrations, whose memory belongs to someone else).
type region struct {
	start, end uint64
	kind       regionKind
	device     int
	mem        []byte
	// file is the shared memory file behind a device allocation, which
	// IPCExport names for other processes (nil where memfd is refused).
	file *os.File
}

// unmap releases what the table mapped for r: its memory and its file.
func (r region) unmap() error {
	if r.file != nil {
		r.file.Close()
	}
	if r.mem == nil {
		return nil
	}
	return hugepage.Unmap(r.mem)
}

// regionTable is a sorted set of non-overlapping ranges. Readers (the
// range checks of every enqueue) load an immutable snapshot without a lock;
// writers (allocations, frees, registrations: rare) copy it under mu.
type regionTable struct {
	what string // "device" or "pinned host", for messages

	mu     sync.Mutex
	closed bool
	used   map[int]uint64 // allocated bytes per device (device table only)
	snap   atomic.Pointer[[]region]
}

func (t *regionTable) init(what string) {
	t.what = what
	t.used = make(map[int]uint64)
	t.snap.Store(&[]region{})
}

// lookup returns the region holding all of [addr, addr+size), or nil.
func (t *regionTable) lookup(addr, size uint64) *region {
	rs := *t.snap.Load()
	// The last region starting at or before addr.
	i, found := slices.BinarySearchFunc(rs, addr, cmpStart)
	if !found {
		i--
	}
	if i < 0 {
		return nil
	}
	// rs[i].start <= addr; the range must end within the region (a
	// zero-size range may sit at its end).
	r := &rs[i]
	if end := addr + size; end < addr || end > r.end {
		return nil
	}
	return r
}

func cmpStart(r region, addr uint64) int {
	switch {
	case r.start < addr:
		return -1
	case r.start > addr:
		return 1
	}
	return 0
}

// insert adds r unless it overlaps a region; it returns the region it
// overlaps, or nil. Caller holds t.mu.
func (t *regionTable) insertLocked(r region) *region {
	rs := *t.snap.Load()
	i, _ := slices.BinarySearchFunc(rs, r.start, cmpStart)
	if i > 0 && rs[i-1].end > r.start {
		return &rs[i-1]
	}
	if i < len(rs) && rs[i].start < r.end {
		return &rs[i]
	}
	next := make([]region, 0, len(rs)+1)
	next = append(next, rs[:i]...)
	next = append(next, r)
	next = append(next, rs[i:]...)
	t.snap.Store(&next)
	return nil
}

// removeLocked removes the region starting exactly at start, if its kind
// is kind. It returns the region and whether it was found with any kind.
// Caller holds t.mu.
func (t *regionTable) removeLocked(start uint64, kind regionKind) (r region, found, removed bool) {
	rs := *t.snap.Load()
	i, ok := slices.BinarySearchFunc(rs, start, cmpStart)
	if !ok {
		return region{}, false, false
	}
	r = rs[i]
	if r.kind != kind {
		return r, true, false
	}
	next := make([]region, 0, len(rs)-1)
	next = append(next, rs[:i]...)
	next = append(next, rs[i+1:]...)
	t.snap.Store(&next)
	return r, true, true
}

// close unmaps every allocation and empties the table; later inserts fail.
func (t *regionTable) close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	var errs []error
	for _, r := range *t.snap.Load() {
		if err := r.unmap(); err != nil {
			errs = append(errs, fmt.Errorf("unmap %s memory %#x: %w", t.what, r.start, err))
		}
	}
	t.snap.Store(&[]region{})
	clear(t.used)
	return errors.Join(errs...)
}

// alloc maps size bytes and enters them in the table. limit, when non-zero,
// bounds the bytes allocated per device.
func (t *regionTable) alloc(op string, kind regionKind, device int, size, limit uint64) (uint64, error) {
	if size == 0 {
		return 0, NewError(op, ErrCodeInvalidValue, "size must be > 0")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, errClosed(op)
	}
	if limit != 0 && size > limit-min(limit, t.used[device]) {
		return 0, NewError(op, ErrCodeOutOfMemory, fmt.Sprintf(
			"cannot allocate %d bytes on emulated device %d: %d of %d bytes in use",
			size, device, t.used[device], limit))
	}
	if size > math.MaxInt {
		return 0, NewError(op, ErrCodeOutOfMemory, fmt.Sprintf("cannot map %d bytes", size))
	}
	if kind == regionHostAlloc {
		// Resident at once (below): refuse what cannot fit before a page
		// is touched, as cuMemHostAlloc fails rather than meet the OOM
		// killer.
		release, err := memavail.Reserve(size)
		if err != nil {
			return 0, NewError(op, ErrCodeOutOfMemory, fmt.Sprintf("%s memory: %v", t.what, err))
		}
		defer release()
	}
	var file *os.File
	fd := -1
	if kind == regionDeviceAlloc {
		// Device memory lives in a shared memory file, so that IPCExport
		// can name it for another process as cuIpcGetMemHandle does.
		file = ipcFile(size)
		if file != nil {
			fd = int(file.Fd())
		}
	}
	// 2 MiB-aligned, so that host memory gets huge pages (internal/hugepage).
	mem, err := hugepage.Map(size, fd)
	if err != nil {
		if file != nil {
			file.Close()
		}
		return 0, NewError(op, ErrCodeOutOfMemory, fmt.Sprintf("mmap of %d bytes of %s memory: %v", size, t.what, err))
	}
	addr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))
	r := region{start: addr, end: addr + size, kind: kind, device: device, mem: mem, file: file}
	if kind == regionHostAlloc {
		// cuMemHostAlloc returns memory that is resident (pinned): the
		// first copy into it takes no page faults, and neither should ours.
		// Device memory stays lazy (the emulated device offers far more
		// than a test touches).
		if err := hugepage.Populate(mem, false); err != nil {
			_ = r.unmap()
			return 0, NewError(op, ErrCodeOutOfMemory, fmt.Sprintf("%d bytes of %s memory: %v", size, t.what, err))
		}
	}
	if other := t.insertLocked(r); other != nil {
		// A fresh mapping cannot overlap another allocation, only a
		// registration of memory that has since been unmapped: the
		// registrant's bug, but refuse rather than alias.
		_ = r.unmap()
		return 0, NewError(op, ErrCodeOutOfMemory, fmt.Sprintf(
			"new mapping %#x+%d overlaps stale %s range %#x+%d", addr, size, t.what, other.start, other.end-other.start))
	}
	if limit != 0 {
		t.used[device] += size
	}
	return addr, nil
}

// free removes an allocation of kind starting at ptr and unmaps it.
func (t *regionTable) free(op string, kind regionKind, ptr uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errClosed(op)
	}
	r, found, removed := t.removeLocked(ptr, kind)
	if !removed {
		desc := fmt.Sprintf("%#x is not the start of a %s allocation", ptr, t.what)
		if found {
			desc = fmt.Sprintf("%#x is a registered %s range, not an allocation", ptr, t.what)
		}
		return NewError(op, ErrCodeInvalidValue, desc)
	}
	if r.kind == regionDeviceAlloc {
		t.used[r.device] -= r.end - r.start
	}
	if err := r.unmap(); err != nil {
		return NewError(op, ErrCodeUnknown, fmt.Sprintf("munmap %#x: %v", ptr, err))
	}
	return nil
}

// insertMapped enters a mapping made elsewhere (IPCOpen's), which free
// unmaps; it fails when the table is closed or the range is taken.
func (t *regionTable) insertMapped(op string, r region) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errClosed(op)
	}
	if other := t.insertLocked(r); other != nil {
		return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("mapping %#x+%d overlaps %s range %#x+%d",
			r.start, r.end-r.start, t.what, other.start, other.end-other.start))
	}
	return nil
}

// register enters [ptr, ptr+size) as a registration; overlapCode is the
// error code when it overlaps a range already in the table.
func (t *regionTable) register(op string, kind regionKind, device int, ptr, size uint64, overlapCode int) error {
	if ptr == 0 || size == 0 {
		return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("pointer %#x and size %d must be non-zero", ptr, size))
	}
	if ptr+size < ptr {
		return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("range %#x+%d wraps around", ptr, size))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errClosed(op)
	}
	if other := t.insertLocked(region{start: ptr, end: ptr + size, kind: kind, device: device}); other != nil {
		return NewError(op, overlapCode, fmt.Sprintf("range %#x+%d overlaps %s range %#x+%d",
			ptr, size, t.what, other.start, other.end-other.start))
	}
	return nil
}

// unregister removes the registration starting at ptr; notFoundCode is the
// error code when there is none.
func (t *regionTable) unregister(op string, kind regionKind, ptr uint64, notFoundCode int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errClosed(op)
	}
	_, found, removed := t.removeLocked(ptr, kind)
	if !removed {
		desc := fmt.Sprintf("%#x is not the start of a registered %s range", ptr, t.what)
		if found {
			desc = fmt.Sprintf("%#x is a %s allocation, not a registration", ptr, t.what)
		}
		return NewError(op, notFoundCode, desc)
	}
	return nil
}
