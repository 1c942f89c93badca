package transfer

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/cuda"
)

// Host layouts the manager allocates live in shared memory files
// (storage.AllocShared), so that a peer process on the same host maps
// them and copies their bytes itself: one memcpy, where a socket costs a
// copy into the kernel and one out of it.

// SharedRegion is memory of a layout that a peer on this host can map: the
// Size bytes that start at Addr here, host memory in File, or a device
// allocation named by IPC (CUDA IPC).
type SharedRegion struct {
	Addr, Size uint64
	File       *os.File
	IPC        *cuda.IPCHandle
}

// CloseRegions closes the files of regions from Shared.
func CloseRegions(regions []SharedRegion) {
	for _, r := range regions {
		if r.File != nil {
			r.File.Close()
		}
	}
}

// allocHost allocates a host layout's memory, shared unless the manager
// is configured private or it cannot be shared here (no memfd, or a driver
// that will not pin it): then as before, private (cuMemHostAlloc for
// pinned memory).
func (m *Manager) allocHost(kind storage.Kind, size uint64) (*storage.Memory, error) {
	if !m.cfg.PrivateHost {
		mem, err := storage.AllocShared(m.drv, m.cfg.Device, size, kind == storage.Pinned)
		if !errors.Is(err, storage.ErrNotShareable) {
			return mem, err
		}
	}
	if kind == storage.Pinned {
		return storage.AllocPinned(m.drv, m.cfg.Device, size)
	}
	return storage.AllocSystem(size)
}

// Shared returns the shared memory behind layout h, registered here, for a
// peer on this host to map. Host memory the manager allocated comes as
// files of their own (duplicates, which stay valid if the layout is
// unregistered meanwhile; the caller closes them with CloseRegions);
// device memory as the CUDA IPC handles of its allocations. Host memory
// the engine registered, device memory the driver cannot export, and disk
// layouts are not shared (ErrUnsupported): peers reach them through Serve.
func (m *Manager) Shared(h LayoutHandle) ([]SharedRegion, error) {
	e, err := m.servable(h, nil)
	if err != nil {
		return nil, err
	}
	// Named under the registry's lock: Unregister takes the layout out
	// under it before it frees the memory and closes the files.
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.entries[h] != e {
		return nil, fmt.Errorf("%w: no layout registered for handle %v", ErrNotFound, h)
	}
	if e.kind == storage.Device {
		return m.exportDevice(e)
	}
	regions := sharedRegions(e)
	if regions == nil {
		return nil, fmt.Errorf("%w: layout %v is %v memory this worker did not allocate as shared", ErrUnsupported, h, e.kind)
	}
	for i, r := range regions {
		fd, err := unix.FcntlInt(r.File.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			CloseRegions(regions[:i])
			return nil, fmt.Errorf("layout %v: duplicate its shared memory file: %w", h, err)
		}
		regions[i].File = os.NewFile(uintptr(fd), "kvbm-memfd")
	}
	return regions, nil
}

// exportDevice names each device allocation a layout's regions lie in,
// once.
func (m *Manager) exportDevice(e *entry) ([]SharedRegion, error) {
	var out []SharedRegion
	for _, r := range e.layout.Regions() {
		h, base, size, err := m.drv.IPCExport(r.Addr, r.Size)
		if err != nil {
			return nil, fmt.Errorf("%w: layout %v: device memory this worker cannot export: %w", ErrUnsupported, e.handle, err)
		}
		if !slices.ContainsFunc(out, func(o SharedRegion) bool { return o.Addr == base }) {
			out = append(out, SharedRegion{Addr: base, Size: size, IPC: &h})
		}
	}
	return out, nil
}

// OpenPeerDevice maps a peer's device allocation (a SharedRegion's IPC
// handle) on this manager's device, for CopyPeerDevice: its address and
// size here; close unmaps it.
func (m *Manager) OpenPeerDevice(h cuda.IPCHandle) (addr, size uint64, close func() error, err error) {
	addr, size, err = m.drv.IPCOpen(m.cfg.Device, h)
	if err != nil {
		return 0, 0, nil, err
	}
	return addr, size, func() error { return m.drv.IPCClose(addr) }, nil
}

// DeviceCopy is one copy between device memory (a peer's, opened with
// OpenPeerDevice) and pinned host memory of this process.
type DeviceCopy struct{ Device, Host, Size uint64 }

// CopyPeerDevice runs copies into device memory (toDevice) or out of it on
// one of the manager's streams and waits for them: what a transport does
// for a peer's device memory it lends.
func (m *Manager) CopyPeerDevice(toDevice bool, copies []DeviceCopy) error {
	release, err := m.hold()
	if err != nil {
		return err
	}
	defer release()
	kind := cuda.DeviceToHost
	if toDevice {
		kind = cuda.HostToDevice
	}
	ops := make([]copyOp, len(copies))
	for i, c := range copies {
		if toDevice {
			ops[i] = copyOp{src: c.Host, dst: c.Device, size: c.Size}
		} else {
			ops[i] = copyOp{src: c.Device, dst: c.Host, size: c.Size}
		}
	}
	return m.syncCopies(kind, ops)
}

// hostShared reports whether a host layout's memory is all shared memory
// files (what Lend asks of every request, without building the regions).
func hostShared(e *entry) bool {
	if !e.kind.IsHost() || len(e.owned) == 0 {
		return false
	}
	for _, o := range e.owned {
		if mem, ok := o.(*storage.Memory); !ok || mem.File() == nil {
			return false
		}
	}
	return true
}

func sharedRegions(e *entry) []SharedRegion {
	if !hostShared(e) {
		return nil
	}
	out := make([]SharedRegion, len(e.owned))
	for i, o := range e.owned {
		mem := o.(*storage.Memory)
		out[i] = SharedRegion{Addr: mem.Addr(), Size: mem.Size(), File: mem.File()}
	}
	return out
}

// Lend checks ops as Serve does, for a peer on this host that copies the
// bytes itself (through h's shared memory it mapped, or, host memory not
// shared, with process_vm_readv/writev, which the kernel allows or not),
// and holds the manager while fn runs (the peer's copy): Close waits for
// it. An error returned without fn having run refused the request.
func (m *Manager) Lend(h LayoutHandle, ops []RemoteOp, fn func() error) error {
	e, err := m.servable(h, ops)
	if err != nil {
		return err
	}
	release, err := m.hold(e)
	if err != nil {
		return err
	}
	defer release()
	return fn()
}
