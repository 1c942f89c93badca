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
// moves them in one vectored call); for device memory, half a stageful at
// a time (for a read, copied out before fn; for a write, copied in after
// fn returns nil). Disk layouts are not served: peers read a disk tier after
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

// serveDevice moves device memory through a pinned staging buffer, in
// two halves that take turns: as many ops (or pieces of a large one) as
// fill a half, copied in one batch and handed to fn together, so that many
// small fragments cost one device round trip and one vectored socket call
// per half; the device copies of one half run while fn moves the other's
// bytes (for a read, the next half is copied out while fn sends this one;
// for a write, this half is copied in while fn receives the next).
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
	kind := cuda.DeviceToHost
	if write {
		kind = cuda.HostToDevice
	}
	const half = stageBytes / 2
	var halves [2]stageHalf
	for i := range halves {
		if halves[i].stream, err = m.streamsFor(kind).next(); err != nil {
			return err
		}
	}
	defer func() { // nothing of the stage may still be in flight when it is put back
		for i := range halves {
			if halves[i].pending {
				_ = m.drv.StreamSynchronize(halves[i].stream)
			}
		}
	}()
	wait := func(h *stageHalf) error {
		if !h.pending {
			return nil
		}
		h.pending = false
		if err := m.drv.StreamSynchronize(h.stream); err != nil {
			m.streamsFor(kind).replace(h.stream)
			return fmt.Errorf("%v copies: %w", kind, err)
		}
		return nil
	}
	enqueue := func(h *stageHalf) error {
		if err := m.enqueueCopies(nil, h.copies, kind, h.stream, 0); err != nil {
			return err
		}
		h.pending = true
		return nil
	}
	var queued []*stageHalf // a read's halves copied out (or being), not yet handed to fn
	// flush hands a filled half on: a read's is copied out, then handed to
	// fn once the other half before it has been; a write's is handed to fn,
	// then copied in.
	flush := func(h *stageHalf) error {
		if len(h.copies) == 0 {
			return nil
		}
		if write {
			if err := fn(h.pieces); err != nil {
				return err
			}
			return enqueue(h)
		}
		if err := enqueue(h); err != nil {
			return err
		}
		queued = append(queued, h)
		return nil
	}
	hand := func(h *stageHalf) error { // a read's half, copied out, to fn
		if err := wait(h); err != nil {
			return err
		}
		return fn(h.pieces)
	}
	cur, used := 0, uint64(0)
	for _, o := range ops {
		for off := uint64(0); off < o.Size; {
			if used == half {
				if err := flush(&halves[cur]); err != nil {
					return err
				}
				cur, used = 1-cur, 0
				h := &halves[cur]
				if len(queued) == 2 { // the half to fill next goes to fn first
					if err := hand(queued[0]); err != nil {
						return err
					}
					queued = queued[1:]
				}
				if err := wait(h); err != nil { // a write's copy in of it is done
					return err
				}
				h.copies, h.pieces = h.copies[:0], h.pieces[:0]
			}
			h := &halves[cur]
			n := min(half-used, o.Size-off)
			base := uint64(cur) * half
			dev, host := o.Remote+off, stage.Addr()+base+used
			if write {
				h.copies = append(h.copies, copyOp{src: host, dst: dev, size: n})
			} else {
				h.copies = append(h.copies, copyOp{src: dev, dst: host, size: n})
			}
			h.pieces = append(h.pieces, buf[base+used:base+used+n])
			used += n
			off += n
		}
	}
	if err := flush(&halves[cur]); err != nil {
		return err
	}
	for _, h := range queued {
		if err := hand(h); err != nil {
			return err
		}
	}
	for i := range halves {
		if err := wait(&halves[i]); err != nil {
			return err
		}
	}
	return nil
}

// stageHalf is half of a staging buffer: its copies and pieces, and the
// stream its copies run on (pending: enqueued, not yet waited for).
type stageHalf struct {
	copies  []copyOp
	pieces  [][]byte
	stream  cuda.Stream
	pending bool
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
