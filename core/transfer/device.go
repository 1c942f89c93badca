package transfer

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kvbm/kvbm/cuda"
)

// streamPool hands out a fixed set of streams round-robin, created on first
// use.
type streamPool struct {
	drv     cuda.Driver
	device  int
	mu      sync.Mutex
	streams []cuda.Stream
	size    int
	next_   int
}

func newStreamPool(drv cuda.Driver, device, size int) *streamPool {
	return &streamPool{drv: drv, device: device, size: size}
}

func (p *streamPool) next() (cuda.Stream, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.streams) < p.size {
		s, err := p.drv.StreamCreate(p.device)
		if err != nil {
			return 0, fmt.Errorf("create stream on device %d: %w", p.device, err)
		}
		p.streams = append(p.streams, s)
		return s, nil
	}
	s := p.streams[p.next_%len(p.streams)]
	p.next_++
	return s, nil
}

func (p *streamPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, s := range p.streams {
		errs = append(errs, p.drv.StreamDestroy(s))
	}
	p.streams = nil
	return errors.Join(errs...)
}

func (m *Manager) streamsFor(kind cuda.CopyKind) *streamPool {
	switch kind {
	case cuda.HostToDevice:
		return m.h2d
	case cuda.DeviceToHost:
		return m.d2h
	}
	return m.d2d
}

// enqueueDevice enqueues a plan's copies on a stream — the caller's, or one
// of the pool's — after the precondition event, and returns a function that
// waits for them. Enqueueing happens before it returns, so an event the
// caller records on its stream afterwards covers these copies.
func (m *Manager) enqueueDevice(p *plan, kind cuda.CopyKind, opts Options) (wait func() error, err error) {
	var stream cuda.Stream
	if opts.Stream != nil {
		stream = *opts.Stream
	} else if stream, err = m.streamsFor(kind).next(); err != nil {
		return nil, err
	}
	if err := m.enqueueCopies(p, kind, stream, opts.Precondition); err != nil {
		return nil, err
	}
	ev, err := m.drv.EventCreate(m.cfg.Device)
	if err != nil {
		return nil, fmt.Errorf("create completion event: %w", err)
	}
	if err := m.drv.EventRecord(ev, stream); err != nil {
		m.drv.EventDestroy(ev)
		return nil, fmt.Errorf("record completion event: %w", err)
	}
	return func() error {
		err := m.drv.EventSynchronize(ev)
		if derr := m.drv.EventDestroy(ev); err == nil && derr != nil {
			err = derr
		}
		if err != nil {
			return fmt.Errorf("%v copies failed: %w", kind, err)
		}
		return nil
	}, nil
}

// enqueueCopies puts a plan's copies on stream, behind precondition when
// it is set.
func (m *Manager) enqueueCopies(p *plan, kind cuda.CopyKind, stream cuda.Stream, precondition cuda.Event) error {
	if precondition != 0 {
		if err := m.drv.StreamWaitEvent(stream, precondition); err != nil {
			return fmt.Errorf("wait for precondition event: %w", err)
		}
	}
	copies := make([]cuda.Copy, len(p.ops))
	for i, op := range p.ops {
		copies[i] = cuda.Copy{Dst: op.dst, Src: op.src, Size: op.size}
	}
	if err := m.drv.MemcpyBatchAsync(kind, copies, stream); err != nil {
		return fmt.Errorf("enqueue %d %v copies: %w", len(copies), kind, err)
	}
	return nil
}
