package cuda

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Emulated is the emulated device: it implements Driver on the host, for
// machines without a GPU (all of CI) and for the demo. It is faithful to
// CUDA's semantics rather than a stub:
//
//   - Device memory (MemAlloc) and pinned host memory (HostAlloc) are
//     anonymous private mmaps, off the Go heap; addresses are real host
//     pointers. RegisterDeviceRange adopts existing host memory (an engine's
//     tensor, a numpy buffer) as device memory; HostRegister "pins" existing
//     host memory. Every copy is checked at enqueue time against these
//     tables, as CUDA checks its arguments: an H2D copy must read pinned or
//     registered host memory and write device memory, and so on.
//   - Every stream is an ordered queue executed by one goroutine. Stream 0 is
//     the legacy default stream, which exists without being created. Created
//     streams are non-blocking: they do not synchronize with stream 0.
//   - Events capture "the work queued on a stream so far"; StreamWaitEvent
//     makes later work on a stream wait for the capture the event had at the
//     time of the call. Nothing busy-waits.
//   - Errors from asynchronous work are sticky per stream: once a copy on a
//     stream fails, later copies and waits on that stream are skipped, and
//     every StreamSynchronize, and every EventQuery/EventSynchronize of an
//     event recorded on that stream after the failed work, returns the
//     first error. A
//     stream that waits on an event whose captured work failed takes on that
//     error too, so a failure is never reported as success downstream. To
//     recover, destroy the stream and create a new one (with the real driver,
//     such errors poison the whole context).
//
// Device memory is host memory, so the CPU can read it (Bytes); real device
// memory cannot be, and code that must work on both should not rely on it.
type Emulated struct {
	numDevices   int
	deviceMemory uint64 // per device; EmulatedDeviceMemory (tests lower it)

	mu     sync.RWMutex
	closed bool
	next   uint64 // last handle given out; streams and events share the counter
	// streams (Stream → *stream, created streams only) and events (Event
	// → *event) are written under mu and read without it, as a driver
	// reads a handle; a handle missing there takes mu to say why (closed,
	// unknown).
	streams handleTable[stream]
	events  handleTable[event]
	legacy  *stream // stream 0, started on first use

	shutdown atomic.Bool   // set by Close before closing is closed
	closing  chan struct{} // closed by Close: waits and queued work abort
	wg       sync.WaitGroup

	devs    regionTable // device memory: MemAlloc and RegisterDeviceRange
	ipcMu   sync.Mutex
	ipcOpen map[ipcName]*emuIPCOpen // IPCOpen: what this process opened, by handle
	hosts   regionTable             // pinned host memory: HostAlloc and HostRegister

	fault atomic.Pointer[copyFaultFunc]

	// inAlloc counts RegisterDeviceRange calls on ranges inside MemAlloc
	// allocations, by start address.
	inAllocMu sync.Mutex
	inAlloc   map[uint64]int
}

var _ Driver = (*Emulated)(nil)

const (
	// EmulatedName is what (*Emulated).Name returns.
	EmulatedName = "emulated"
	// EmulatedDeviceName is the name of every emulated device.
	EmulatedDeviceName = "kvbm emulated device"
	// EmulatedDeviceMemory is the memory of each emulated device: MemAlloc
	// beyond it fails with CUDA_ERROR_OUT_OF_MEMORY (and so does a MemAlloc
	// the host cannot map). Mappings are lazy, so only the bytes touched take
	// host memory. Registered device ranges do not count against it.
	EmulatedDeviceMemory uint64 = 64 << 30
)

// copyFaultFunc decides, at execution time, whether one copy fails. See
// (*Emulated).InjectCopyFault.
type copyFaultFunc func(kind CopyKind, c Copy) error

// NewEmulated makes an emulated driver with numDevices devices (none when
// numDevices <= 0). Close it to stop its stream goroutines and free its
// memory.
func NewEmulated(numDevices int) *Emulated {
	if numDevices < 0 {
		numDevices = 0
	}
	e := &Emulated{
		numDevices:   numDevices,
		deviceMemory: EmulatedDeviceMemory,
		closing:      make(chan struct{}),
	}
	e.devs.init("device")
	e.hosts.init("pinned host")
	return e
}

// Close stops every stream and frees all memory from MemAlloc and HostAlloc
// (registrations are dropped; registered memory stays its owner's). Work
// already queued and not yet started is abandoned: the events and
// synchronizations that cover it complete with CUDA_ERROR_NOT_INITIALIZED. A
// copy already executing finishes first, so Close blocks while a copy-fault
// hook blocks. When Close returns no goroutine of e is left, and every later
// call fails with CUDA_ERROR_NOT_INITIALIZED. Views from Bytes must not be
// used after Close. Close is idempotent.
func (e *Emulated) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	var streams []*stream
	e.streams.each(func(s *stream) { streams = append(streams, s) })
	if e.legacy != nil {
		streams = append(streams, e.legacy)
	}
	e.streams.clear()
	e.events.clear()
	e.mu.Unlock()

	e.shutdown.Store(true)
	close(e.closing)
	for _, s := range streams {
		s.stop()
	}
	// Destroyed streams still draining are not in the table; they see
	// shutdown and exit too.
	e.wg.Wait()

	return errors.Join(e.devs.close(), e.hosts.close())
}

// Name returns "emulated".
func (e *Emulated) Name() string { return EmulatedName }

// DeviceCount returns the number of emulated devices.
func (e *Emulated) DeviceCount() (int, error) {
	if err := e.checkOpen("cuDeviceGetCount"); err != nil {
		return 0, err
	}
	return e.numDevices, nil
}

// Device describes an emulated device.
func (e *Emulated) Device(ordinal int) (DeviceInfo, error) {
	const op = "cuDeviceGet"
	if err := e.checkDevice(op, ordinal); err != nil {
		return DeviceInfo{}, err
	}
	return DeviceInfo{
		Ordinal:     ordinal,
		Name:        EmulatedDeviceName,
		TotalMemory: e.deviceMemory,
		NUMANode:    -1,
	}, nil
}

// InjectCopyFault sets a hook for tests of callers: every copy, when it
// executes on its stream's goroutine (not when it is enqueued), first calls
// fn with its kind and addresses (each copy of a batch separately;
// zero-size copies are not executed and not passed). A non-nil result fails
// that copy: its bytes do not move, the stream's sticky error is set (see
// Emulated), and StreamSynchronize, EventQuery and EventSynchronize covering
// it return an error wrapping fn's result (errors.Is/As see it).
//
// fn runs on stream goroutines, concurrently for different streams, and
// must be safe for that. It may block, which holds its stream (a way for
// tests to keep work queued); Close waits for it. InjectCopyFault(nil)
// removes the hook. The hook is read at each copy, so setting it affects
// copies already queued but not yet executed.
func (e *Emulated) InjectCopyFault(fn func(kind CopyKind, c Copy) error) {
	if fn == nil {
		e.fault.Store(nil)
		return
	}
	f := copyFaultFunc(fn)
	e.fault.Store(&f)
}

// Bytes is a view of size bytes at addr, which must lie within one
// emulated device range (allocated or registered) or one pinned host range
// (allocated or registered); otherwise it fails with
// CUDA_ERROR_INVALID_VALUE. It is for tests and host-side access. The view
// is valid until the memory is freed or e is closed; it is not ordered with
// respect to queued copies (synchronize first).
func (e *Emulated) Bytes(addr, size uint64) ([]byte, error) {
	const op = "Bytes"
	if err := e.checkOpen(op); err != nil {
		return nil, err
	}
	if e.hosts.lookup(addr, size) == nil && e.devs.lookup(addr, size) == nil {
		return nil, NewError(op, ErrCodeInvalidValue, fmt.Sprintf(
			"range %#x+%d is not within one emulated device or pinned host range", addr, size))
	}
	if size == 0 {
		return []byte{}, nil
	}
	return view(addr, size), nil
}

func (e *Emulated) checkOpen(op string) error {
	e.mu.RLock()
	closed := e.closed
	e.mu.RUnlock()
	if closed {
		return errClosed(op)
	}
	return nil
}

func (e *Emulated) checkDevice(op string, ordinal int) error {
	if err := e.checkOpen(op); err != nil {
		return err
	}
	if ordinal < 0 || ordinal >= e.numDevices {
		return NewError(op, ErrCodeInvalidDevice, fmt.Sprintf(
			"device ordinal %d out of range: the emulated driver has %d device(s)", ordinal, e.numDevices))
	}
	return nil
}

// newHandle gives out the next handle value; never zero, never reused.
// Caller holds e.mu for writing.
func (e *Emulated) newHandle() uint64 {
	e.next++
	return e.next
}

func errClosed(op string) error {
	return NewError(op, ErrCodeNotInitialized, "the emulated device is closed")
}
