package transfer

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvbm/kvbm/cuda"
)

// streamPool hands out a fixed set of streams round-robin, created on first
// use. Once all exist, next reads them without the lock (every device
// transfer asks for one).
type streamPool struct {
	drv    cuda.Driver
	device int
	mu     sync.Mutex
	made   int // streams created so far, under mu
	// streams[i] is stream i once made (replace swaps it under mu); full
	// is set once all are made, and rr picks the next.
	streams []atomic.Uintptr
	full    atomic.Bool
	rr      atomic.Uint64
}

func newStreamPool(drv cuda.Driver, device, size int) *streamPool {
	return &streamPool{drv: drv, device: device, streams: make([]atomic.Uintptr, size)}
}

func (p *streamPool) next() (cuda.Stream, error) {
	if !p.full.Load() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.made < len(p.streams) {
			s, err := p.drv.StreamCreate(p.device)
			if err != nil {
				return 0, fmt.Errorf("create stream on device %d: %w", p.device, err)
			}
			p.streams[p.made].Store(uintptr(s))
			p.made++
			p.full.Store(p.made == len(p.streams))
			return s, nil
		}
	}
	return cuda.Stream(p.streams[(p.rr.Add(1)-1)%uint64(len(p.streams))].Load()), nil
}

// replace swaps a stream whose work failed — its error is sticky — for a
// fresh one, so that later transfers do not inherit the failure.
func (p *streamPool) replace(old cuda.Stream) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.made {
		if cuda.Stream(p.streams[i].Load()) == old {
			if fresh, err := p.drv.StreamCreate(p.device); err == nil {
				p.streams[i].Store(uintptr(fresh))
				p.drv.StreamDestroy(old)
			}
			return
		}
	}
}

func (p *streamPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.full.Store(false)
	var errs []error
	for i := range p.made {
		errs = append(errs, p.drv.StreamDestroy(cuda.Stream(p.streams[i].Swap(0))))
	}
	p.made = 0
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

// splitBytes is the least a transfer moves per stream when it is spread
// over several of the pool's streams (copy engines, or host cores for the
// emulated device).
const splitBytes = 16 << 20

// enqueueDevice enqueues a plan's copies after the precondition event and
// returns a function that waits for them. On the caller's stream the copies
// go in order, before enqueueDevice returns, so that an event the caller
// records afterwards covers them; without one, a large plan is spread over
// several of the pool's streams.
func (m *Manager) enqueueDevice(p *plan, kind cuda.CopyKind, opts Options) (wait func() error, err error) {
	d, err := m.enqueueDeviceQuery(p, kind, opts)
	if err != nil {
		return nil, err
	}
	return d.wait, nil
}

// deviceCopies are a plan's copies enqueued on one or more streams, each
// with its completion event. One stream's fit in the struct itself, so
// that a small transfer's enqueue is one allocation.
type deviceCopies struct {
	m            *Manager
	kind         cuda.CopyKind
	callerStream bool
	streams      []cuda.Stream
	events       []cuda.Event
	streamBuf    [1]cuda.Stream
	eventBuf     [1]cuda.Event
	copyBuf      [1]cuda.Copy // a one-block transfer's copy, without an allocation of its own
}

// enqueueDeviceQuery is enqueueDevice; the copies' done reports whether
// they are already complete (the device ran them before the call
// returned), so that the caller can finish without a goroutine waiting for
// them.
func (m *Manager) enqueueDeviceQuery(p *plan, kind cuda.CopyKind, opts Options) (*deviceCopies, error) {
	d := new(deviceCopies)
	if err := m.enqueueDeviceInto(d, p, kind, opts); err != nil {
		return nil, err
	}
	return d, nil
}

// enqueueDeviceInto is enqueueDeviceQuery into new, zero copies the caller
// allocated.
func (m *Manager) enqueueDeviceInto(d *deviceCopies, p *plan, kind cuda.CopyKind, opts Options) error {
	d.m, d.kind, d.callerStream = m, kind, opts.Stream != nil
	d.streams, d.events = d.streamBuf[:0], d.eventBuf[:0]
	k, per := 1, len(p.ops)
	if opts.Stream != nil {
		d.streams = append(d.streams, *opts.Stream)
	} else {
		k = int(min(uint64(m.cfg.StreamsPerDirection), max(p.bytes()/splitBytes, 1)))
		k = min(k, max(len(p.ops), 1))
		per = (len(p.ops) + k - 1) / k
		for range k {
			s, err := m.streamsFor(kind).next()
			if err != nil {
				return err
			}
			d.streams = append(d.streams, s)
		}
	}
	for i, s := range d.streams {
		part := p.ops[min(i*per, len(p.ops)):min((i+1)*per, len(p.ops))]
		if err := m.enqueueCopies(d.copyBuf[:0], part, kind, s, opts.Precondition); err != nil {
			d.abandon()
			return err
		}
		ev, err := m.events.get()
		if err != nil {
			d.abandon()
			return fmt.Errorf("create completion event: %w", err)
		}
		d.events = append(d.events, ev)
		if err := m.drv.EventRecord(ev, s); err != nil {
			d.abandon()
			return fmt.Errorf("record completion event: %w", err)
		}
	}
	return nil
}

// done reports whether every copy is complete and, if so, ends them as wait
// would: a one-event transfer the device ran within its call is finished
// from its query, not queried and then synchronized.
func (d *deviceCopies) done() (bool, error) {
	for _, ev := range d.events {
		if ok, err := d.m.drv.EventQuery(ev); !ok {
			return false, nil
		} else if len(d.events) == 1 {
			return true, d.settle(func(cuda.Event) error { return err })
		}
	}
	return true, d.wait() // several: wait names each failure
}

// wait waits for the copies, returns their events to the free list, and
// replaces a pool stream whose work failed.
func (d *deviceCopies) wait() error {
	return d.settle(d.m.drv.EventSynchronize)
}

// settle ends the copies with each event's result: it returns the events
// to the free list and replaces a pool stream whose work failed.
func (d *deviceCopies) settle(result func(ev cuda.Event) error) error {
	var errs []error
	for i, ev := range d.events {
		if err := result(ev); err != nil {
			errs = append(errs, err)
			if !d.callerStream {
				d.m.streamsFor(d.kind).replace(d.streams[i])
			}
		}
	}
	d.release()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%v copies failed: %w", d.kind, err)
	}
	return nil
}

// abandon ends copies whose enqueue failed part way: the copies already
// queued on their streams run to their end before the caller lets go of
// the layouts (a withdrawn layout's memory may go to its next use as soon
// as it does), then the events go back.
func (d *deviceCopies) abandon() {
	d.m.settleStreams(d.streams...)
	d.release()
}

// settleStreams waits until the work queued on streams so far is done
// (errors ignored: the caller is already failing).
func (m *Manager) settleStreams(streams ...cuda.Stream) {
	for _, s := range streams {
		if s != 0 {
			_ = m.drv.StreamSynchronize(s)
		}
	}
}

func (d *deviceCopies) release() {
	for _, ev := range d.events {
		d.m.events.put(ev)
	}
	d.events = d.events[:0]
}

// enqueueCopies puts copies on stream, behind precondition when it is
// set. The driver's copy list is built in buf (appended to, may be nil;
// the driver keeps no reference to it).
func (m *Manager) enqueueCopies(buf []cuda.Copy, ops []copyOp, kind cuda.CopyKind, stream cuda.Stream, precondition cuda.Event) error {
	if precondition != 0 {
		if err := m.drv.StreamWaitEvent(stream, precondition); err != nil {
			return fmt.Errorf("wait for precondition event: %w", err)
		}
	}
	copies := buf[:0]
	for _, op := range ops {
		copies = append(copies, cuda.Copy{Dst: op.dst, Src: op.src, Size: op.size})
	}
	if err := m.drv.MemcpyBatchAsync(kind, copies, stream); err != nil {
		return fmt.Errorf("enqueue %d %v copies: %w", len(copies), kind, err)
	}
	return nil
}
