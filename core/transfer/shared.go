package transfer

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/core/storage"
)

// Host layouts the manager allocates live in shared memory files
// (storage.AllocShared), so that a peer process on the same host maps
// them and copies their bytes itself: one memcpy, where a socket costs a
// copy into the kernel and one out of it.

// SharedRegion is memory of a layout that a peer on this host can map: the
// file holds the Size bytes that start at Addr here.
type SharedRegion struct {
	Addr, Size uint64
	File       *os.File
}

// CloseRegions closes the files of regions from Shared.
func CloseRegions(regions []SharedRegion) {
	for _, r := range regions {
		r.File.Close()
	}
}

// allocHost allocates a host layout's memory, shared unless the manager
// is configured private or the kernel cannot share it.
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
// peer on this host to map: each region with a file of its own (a
// duplicate, which stays valid if the layout is unregistered meanwhile;
// the caller closes them with CloseRegions). Layouts the engine registered
// by pointer, and device and disk layouts, are not shared (ErrUnsupported):
// peers reach them through Serve.
func (m *Manager) Shared(h LayoutHandle) ([]SharedRegion, error) {
	e, err := m.servable(h, nil)
	if err != nil {
		return nil, err
	}
	// Duplicated under the registry's lock: Unregister takes the layout
	// out under it before it closes the files.
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.entries[h] != e {
		return nil, fmt.Errorf("%w: no layout registered for handle %v", ErrNotFound, h)
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

func sharedRegions(e *entry) []SharedRegion {
	if !e.kind.IsHost() {
		return nil
	}
	var out []SharedRegion
	for _, o := range e.owned {
		mem, ok := o.(*storage.Memory)
		if !ok || mem.File() == nil {
			return nil
		}
		out = append(out, SharedRegion{Addr: mem.Addr(), Size: mem.Size(), File: mem.File()})
	}
	return out
}

// Lend checks ops as Serve does, for a peer that mapped h's shared memory
// and copies the bytes itself, and holds the manager while fn runs (the
// peer's copy): Close waits for it. An error returned without fn having
// run refused the request.
func (m *Manager) Lend(h LayoutHandle, ops []RemoteOp, fn func() error) error {
	e, err := m.servable(h, ops)
	if err != nil {
		return err
	}
	if sharedRegions(e) == nil {
		return fmt.Errorf("%w: layout %v is not shared memory; read or write it through Serve", ErrUnsupported, h)
	}
	release, err := m.hold(e)
	if err != nil {
		return err
	}
	defer release()
	return fn()
}
