package transfer

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/cuda"
)

// stageBytes is the pinned staging buffer a transport server moves device
// memory through, one piece at a time.
const stageBytes = 4 << 20

// Serve lends a transport server the bytes of ops (Remote and Size; Local
// is ignored) in layout h, registered here (not imported), while fn runs;
// Close waits for it. Every op is checked before fn is first called. fn
// gets the pieces that cover the ops in order: for host memory, all of
// them in one call, the memory itself (so that a socket moves them in one
// vectored call); for device memory, one staged piece per call (for a
// read, copied out before fn; for a write, copied in after fn returns
// nil). Disk layouts are not served: peers read a disk tier after it is
// staged in host memory.
func (m *Manager) Serve(h LayoutHandle, ops []RemoteOp, write bool, fn func(pieces [][]byte) error) error {
	var e *entry
	for _, o := range ops {
		var err error
		if e, err = m.servable(h, o.Remote, o.Size); err != nil {
			return err
		}
	}
	if e == nil {
		return nil
	}
	release, err := m.hold(e)
	if err != nil {
		return err
	}
	defer release()
	if e.kind == storage.Device {
		return m.serveDevice(ops, write, fn)
	}
	pieces := make([][]byte, len(ops)) // servable admits host kinds and device only
	for i, o := range ops {
		pieces[i] = storage.HostBytes(o.Remote, o.Size)
	}
	return fn(pieces)
}

// serveDevice moves device memory through a pinned staging buffer: as
// many ops (or pieces of a large one) as fill it at a time, copied in one
// batch and handed to fn together, so that many small fragments cost one
// device round trip and one vectored socket call per stageful.
func (m *Manager) serveDevice(ops []RemoteOp, write bool, fn func([][]byte) error) error {
	stage, err := m.stages.get(m)
	if err != nil {
		return err
	}
	defer m.stages.put(stage)
	buf, err := stage.Bytes()
	if err != nil {
		return err
	}
	var copies []copyOp
	var pieces [][]byte
	flush := func() error {
		if len(copies) == 0 {
			return nil
		}
		if !write {
			if err := m.syncCopies(cuda.DeviceToHost, copies); err != nil {
				return err
			}
		}
		if err := fn(pieces); err != nil {
			return err
		}
		if write {
			if err := m.syncCopies(cuda.HostToDevice, copies); err != nil {
				return err
			}
		}
		copies, pieces = copies[:0], pieces[:0]
		return nil
	}
	used := uint64(0)
	for _, o := range ops {
		for off := uint64(0); off < o.Size; {
			if used == stageBytes {
				if err := flush(); err != nil {
					return err
				}
				used = 0
			}
			n := min(stageBytes-used, o.Size-off)
			dev, host := o.Remote+off, stage.Addr()+used
			if write {
				copies = append(copies, copyOp{src: host, dst: dev, size: n})
			} else {
				copies = append(copies, copyOp{src: dev, dst: host, size: n})
			}
			pieces = append(pieces, buf[used:used+n])
			used += n
			off += n
		}
	}
	return flush()
}

// syncCopies runs device copies on a pool stream and waits for them.
func (m *Manager) syncCopies(kind cuda.CopyKind, ops []copyOp) error {
	s, err := m.streamsFor(kind).next()
	if err != nil {
		return err
	}
	if err := m.enqueueCopies(ops, kind, s, 0); err != nil {
		return err
	}
	if err := m.drv.StreamSynchronize(s); err != nil {
		m.streamsFor(kind).replace(s)
		return fmt.Errorf("%v copies: %w", kind, err)
	}
	return nil
}

// stagePool keeps the pinned staging buffers of serveDevice.
type stagePool struct {
	mu   sync.Mutex
	free []*storage.Memory
	all  []*storage.Memory
}

func (p *stagePool) get(m *Manager) (*storage.Memory, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.free); n > 0 {
		s := p.free[n-1]
		p.free = p.free[:n-1]
		return s, nil
	}
	s, err := storage.AllocPinned(m.drv, m.cfg.Device, stageBytes)
	if err != nil {
		return nil, fmt.Errorf("allocate pinned staging: %w", err)
	}
	p.all = append(p.all, s)
	return s, nil
}

func (p *stagePool) put(s *storage.Memory) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free = append(p.free, s)
}

func (p *stagePool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, s := range p.all {
		errs = append(errs, s.Close())
	}
	p.all, p.free = nil, nil
	return errors.Join(errs...)
}

// CheckServe reports whether Serve would lend [addr, addr+size) of layout
// h, so that a server can refuse a request before it moves any byte.
func (m *Manager) CheckServe(h LayoutHandle, addr, size uint64) error {
	_, err := m.servable(h, addr, size)
	return err
}

func (m *Manager) servable(h LayoutHandle, addr, size uint64) (*entry, error) {
	e, err := m.lookup(h)
	if err != nil {
		return nil, err
	}
	if e.owner != nil || e.remote != nil {
		return nil, fmt.Errorf("%w: layout %v is imported here; a worker serves only its own", ErrInvalidArgument, h)
	}
	if !e.kind.IsHost() && e.kind != storage.Device {
		return nil, fmt.Errorf("%w: layout %v is %v; peers reach host and device memory only (stage disk blocks in G2 first)",
			ErrUnsupported, h, e.kind)
	}
	if !e.layout.Contains(addr, size) {
		return nil, fmt.Errorf("%w: bytes [%#x, +%d) are not inside one region of layout %v", ErrOutOfRange, addr, size, h)
	}
	return e, nil
}
