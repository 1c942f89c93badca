package transfer

import (
	"fmt"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/kvbmerr"
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
		return nil, fmt.Errorf("%w: layout %v is imported here; a worker serves only its own", kvbmerr.ErrInvalidArgument, h)
	}
	if !e.kind.IsHost() && e.kind != storage.Device {
		return nil, fmt.Errorf("%w: layout %v is %v; peers reach host and device memory only (stage disk blocks in G2 first)",
			kvbmerr.ErrUnsupported, h, e.kind)
	}
	for _, o := range ops {
		if !e.layout.Contains(o.Remote, o.Size) {
			return nil, fmt.Errorf("%w: bytes [%#x, +%d) are not inside one region of layout %v", kvbmerr.ErrOutOfRange, o.Remote, o.Size, h)
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
	s := &stagedServe{m: m, kind: cuda.DeviceToHost, write: write, fn: fn, addr: stage.Addr(), buf: buf}
	if write {
		s.kind = cuda.HostToDevice
	}
	for i := range s.halves {
		if s.halves[i].stream, err = m.streamsFor(s.kind).next(); err != nil {
			return err
		}
	}
	defer s.settle() // nothing of the stage may still be in flight when it is put back
	for _, o := range ops {
		for off := uint64(0); off < o.Size; {
			if s.used == stageHalfBytes {
				if err := s.turn(); err != nil {
					return err
				}
			}
			off += s.add(o.Remote+off, o.Size-off)
		}
	}
	return s.finish()
}

// stageHalfBytes is the size of each half of a staging buffer.
const stageHalfBytes = stageBytes / 2

// stagedServe is one request's device memory on its way through a
// staging buffer (serveDevice): the half being filled, and a read's
// halves copied out (or being) that fn has not had yet.
type stagedServe struct {
	m      *Manager
	kind   cuda.CopyKind
	write  bool
	fn     func([][]byte) error
	addr   uint64 // the staging buffer's address
	buf    []byte // and its bytes
	halves [2]stageHalf
	cur    int    // the half being filled
	used   uint64 // its bytes filled so far
	queued []*stageHalf
}

// stageHalf is half of a staging buffer: its copies and pieces, and the
// stream its copies run on (pending: enqueued, not yet waited for).
type stageHalf struct {
	copies  []copyOp
	pieces  [][]byte
	stream  cuda.Stream
	pending bool
}

// add puts up to n bytes at device address dev in the half being filled,
// as much as it has room for, and returns how many.
func (s *stagedServe) add(dev, n uint64) uint64 {
	h := &s.halves[s.cur]
	n = min(stageHalfBytes-s.used, n)
	at := uint64(s.cur)*stageHalfBytes + s.used
	if host := s.addr + at; s.write {
		h.copies = append(h.copies, copyOp{src: host, dst: dev, size: n})
	} else {
		h.copies = append(h.copies, copyOp{src: dev, dst: host, size: n})
	}
	h.pieces = append(h.pieces, s.buf[at:at+n])
	s.used += n
	return n
}

// turn hands the filled half on and makes the other the one to fill,
// once what it held is done with.
func (s *stagedServe) turn() error {
	if err := s.flush(&s.halves[s.cur]); err != nil {
		return err
	}
	s.cur, s.used = 1-s.cur, 0
	h := &s.halves[s.cur]
	if len(s.queued) == 2 { // the half to fill next goes to fn first
		if err := s.hand(s.queued[0]); err != nil {
			return err
		}
		s.queued = s.queued[1:]
	}
	if err := s.wait(h); err != nil { // a write's copy in of it is done
		return err
	}
	h.copies, h.pieces = h.copies[:0], h.pieces[:0]
	return nil
}

// finish hands the last half on, then a read's halves still queued to
// fn, and waits for every copy.
func (s *stagedServe) finish() error {
	if err := s.flush(&s.halves[s.cur]); err != nil {
		return err
	}
	for _, h := range s.queued {
		if err := s.hand(h); err != nil {
			return err
		}
	}
	for i := range s.halves {
		if err := s.wait(&s.halves[i]); err != nil {
			return err
		}
	}
	return nil
}

// flush hands a filled half on: a read's is copied out, then handed to fn
// once the other half before it has been; a write's is handed to fn, then
// copied in.
func (s *stagedServe) flush(h *stageHalf) error {
	if len(h.copies) == 0 {
		return nil
	}
	if s.write {
		if err := s.fn(h.pieces); err != nil {
			return err
		}
		return s.enqueue(h)
	}
	if err := s.enqueue(h); err != nil {
		return err
	}
	s.queued = append(s.queued, h)
	return nil
}

// hand gives fn a read's half, once it is copied out.
func (s *stagedServe) hand(h *stageHalf) error {
	if err := s.wait(h); err != nil {
		return err
	}
	return s.fn(h.pieces)
}

func (s *stagedServe) enqueue(h *stageHalf) error {
	if err := s.m.enqueueCopies(nil, h.copies, s.kind, h.stream, 0); err != nil {
		return err
	}
	h.pending = true
	return nil
}

// wait waits for a half's copies, if they are in flight.
func (s *stagedServe) wait(h *stageHalf) error {
	if !h.pending {
		return nil
	}
	h.pending = false
	if err := s.m.drv.StreamSynchronize(h.stream); err != nil {
		s.m.streamsFor(s.kind).replace(h.stream)
		return fmt.Errorf("%v copies: %w", s.kind, err)
	}
	return nil
}

// settle waits for what is still in flight, after an error.
func (s *stagedServe) settle() {
	for i := range s.halves {
		if s.halves[i].pending {
			_ = s.m.drv.StreamSynchronize(s.halves[i].stream)
		}
	}
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
