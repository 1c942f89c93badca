package transfer

import (
	"fmt"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/cuda"
)

// stageBytes is the pinned staging buffer a transport server moves device
// memory through, one piece at a time.
const stageBytes = 4 << 20

// Serve lends a transport server the bytes of ops (Remote and Size; Local
// is ignored) in layout h, registered here (not imported), while fn runs;
// Close waits for it. Every op is checked before fn is first called, so an
// error returned without fn having run refused the request before any
// byte moved. fn gets the pieces that cover the ops in order: for host
// memory, all of them in one call, the memory itself (so that a socket
// moves them in one vectored call); for device memory, a stageful at a
// time (for a read, copied out before fn; for a write, copied in after fn
// returns nil). Disk layouts are not served: peers read a disk tier after
// it is staged in host memory.
func (m *Manager) Serve(h LayoutHandle, ops []RemoteOp, write bool, fn func(pieces [][]byte) error) error {
	e, err := m.servable(h, ops)
	if err != nil || len(ops) == 0 {
		return err
	}
	release, err := m.hold(e)
	if err != nil {
		return err
	}
	defer release()
	if e.kind == storage.Device {
		return m.serveDevice(ops, write, fn)
	}
	pieces := make([][]byte, len(ops))
	for i, o := range ops {
		pieces[i] = storage.HostBytes(o.Remote, o.Size)
	}
	return fn(pieces)
}

// servable checks that a peer may reach ops in layout h: a host or device
// layout registered here, every op inside one of its regions.
func (m *Manager) servable(h LayoutHandle, ops []RemoteOp) (*entry, error) {
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
	for _, o := range ops {
		if !e.layout.Contains(o.Remote, o.Size) {
			return nil, fmt.Errorf("%w: bytes [%#x, +%d) are not inside one region of layout %v", ErrOutOfRange, o.Remote, o.Size, h)
		}
	}
	return e, nil
}

// serveDevice moves device memory through a pinned staging buffer: as
// many ops (or pieces of a large one) as fill it at a time, copied in one
// batch and handed to fn together, so that many small fragments cost one
// device round trip and one vectored socket call per stageful.
func (m *Manager) serveDevice(ops []RemoteOp, write bool, fn func([][]byte) error) error {
	stage, err := m.stages.get(m.cfg.RemoteDeadline)
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
	if err := m.enqueueCopies(nil, ops, kind, s, 0); err != nil {
		return err
	}
	if err := m.drv.StreamSynchronize(s); err != nil {
		m.streamsFor(kind).replace(s)
		return fmt.Errorf("%v copies: %w", kind, err)
	}
	return nil
}
