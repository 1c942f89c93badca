package cuda

import (
	"fmt"
	"sync"

	"github.com/kvbm/kvbm/internal/memcopy"
)

// Streams of the emulated device: each is an unbounded ordered queue run by
// one goroutine. Enqueueing never blocks on the work, with one exception
// that CUDA allows too (an async call may complete before it returns): work
// that is small and has nothing ahead of it on an idle stream runs on the
// caller, so that a small transfer costs no hand-off to the stream's
// goroutine. Never while a copy-fault hook is set, so that tests that hold
// copies in the device see them queued.

// inlineBytes is the most a copy item may move to run on the caller. Small
// enough that many transfers in flight at once still spread over the
// streams' goroutines (kvbm bench, 256 one-block calls of 256 KiB: 0.63
// of one call when they ran inline, 0.80-0.92 queued), large enough for a
// 32 KiB fragment or a one-block call of it to pay no hand-off.
const inlineBytes = 64 << 10

type opKind uint8

const (
	opCopy   opKind = iota + 1 // one copy
	opBatch                    // copies of one kind, in order
	opMarker                   // completes m (an event record, a synchronize)
	opWait                     // waits for m (StreamWaitEvent)
)

type item struct {
	op    opKind
	kind  CopyKind
	c     Copy
	batch []Copy
	m     *marker
}

// marker is a point in a stream's queue. done is closed, and err set before
// that, when the stream's goroutine reaches it; err is the stream's sticky
// error at that point (nil when all work before it succeeded).
type marker struct {
	done chan struct{}
	err  error
}

func newMarker() *marker { return &marker{done: make(chan struct{})} }

// reached is a marker reached without error, shared by every record on an
// idle stream whose work all succeeded (a small transfer's completion
// event): such a record allocates and enqueues nothing.
var reached = func() *marker {
	m := newMarker()
	close(m.done)
	return m
}()

// complete reports whether m has been reached, and its error.
func (m *marker) complete() (bool, error) {
	select {
	case <-m.done:
		return true, m.err
	default:
		return false, nil
	}
}

type stream struct {
	e      *Emulated
	handle Stream
	device int // -1 for the legacy default stream

	mu        sync.Mutex
	cond      sync.Cond
	q         []item
	busy      bool // work is executing, on the goroutine or inline
	destroyed bool // StreamDestroy: drain, then exit
	stopped   bool // Close: abandon, then exit

	err error // sticky; owned by the goroutine
}

func (e *Emulated) newStream(h Stream, device int) *stream {
	s := &stream{e: e, handle: h, device: device}
	s.cond.L = &s.mu
	e.wg.Add(1)
	go s.run()
	return s
}

// push enqueues it, unless the stream is destroyed or stopped.
func (s *stream) push(op string, it item) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return errClosed(op)
	case s.destroyed:
		return NewError(op, ErrCodeInvalidHandle, fmt.Sprintf("stream %d is destroyed", s.handle))
	}
	if len(s.q) == 0 && !s.busy && s.inlinable(&it) {
		s.busy = true
		s.mu.Unlock()
		s.exec(&it)
		s.mu.Lock()
		s.busy = false
		if len(s.q) > 0 || s.destroyed || s.stopped {
			// Work queued, or a destroy, waited for this. Otherwise the
			// worker has nothing to do: waking it would cost a thread
			// switch per call.
			s.cond.Signal()
		}
		return nil
	}
	s.q = append(s.q, it)
	if len(s.q) == 1 && !s.busy { // while busy, the inline caller signals when it is done
		s.cond.Signal()
	}
	return nil
}

// record returns the marker of an event record on s: reached when s is
// idle and its work all succeeded, else a new marker in its queue.
func (s *stream) record(op string) (*marker, error) {
	s.mu.Lock()
	// Nothing runs or waits, so s.err is not being written (busy and the
	// queue change under s.mu).
	idle := !s.stopped && !s.destroyed && len(s.q) == 0 && !s.busy && s.err == nil && !s.e.shutdown.Load()
	s.mu.Unlock()
	if idle {
		return reached, nil
	}
	m := newMarker()
	return m, s.push(op, item{op: opMarker, m: m})
}

// inlinable reports whether it may run on the caller: a marker, a wait
// already satisfied, or a small copy while no fault hook is set.
func (s *stream) inlinable(it *item) bool {
	switch it.op {
	case opMarker:
		return true
	case opWait:
		done, _ := it.m.complete()
		return done
	}
	if s.e.fault.Load() != nil || s.e.shutdown.Load() {
		return false
	}
	if it.op == opCopy {
		return it.c.Size <= inlineBytes
	}
	var n uint64
	for _, c := range it.batch {
		if n += c.Size; n > inlineBytes {
			return false
		}
	}
	return true
}

func (s *stream) stop() {
	s.mu.Lock()
	s.stopped = true
	s.cond.Signal()
	s.mu.Unlock()
}

func (s *stream) destroy() {
	s.mu.Lock()
	s.destroyed = true
	s.cond.Signal()
	s.mu.Unlock()
}

func (s *stream) run() {
	defer s.e.wg.Done()
	var work []item
	for {
		s.mu.Lock()
		// Wait while work runs inline on a caller, or until there is work
		// or the stream ends.
		for s.busy || (len(s.q) == 0 && !s.destroyed && !s.stopped) {
			s.cond.Wait()
		}
		if len(s.q) == 0 {
			s.mu.Unlock()
			return
		}
		work, s.q = s.q, work[:0]
		s.busy = true
		s.mu.Unlock()
		for i := range work {
			s.exec(&work[i])
			work[i] = item{} // drop references to batches and markers
		}
		s.mu.Lock()
		s.busy = false
		s.mu.Unlock()
	}
}

func (s *stream) exec(it *item) {
	if s.err == nil && s.e.shutdown.Load() {
		s.err = errClosed("stream work")
	}
	switch it.op {
	case opCopy:
		if s.err == nil {
			s.err = s.e.execCopy(it.kind, it.c)
		}
	case opBatch:
		for _, c := range it.batch {
			if s.err != nil {
				break
			}
			s.err = s.e.execCopy(it.kind, c)
		}
	case opWait:
		if done, err := it.m.complete(); done && s.err == nil {
			s.err = err // no lock taken on a shared reached marker
			break
		}
		if s.err == nil {
			select {
			case <-it.m.done:
				if it.m.err != nil {
					s.err = it.m.err
				}
			case <-s.e.closing:
				s.err = errClosed("stream wait")
			}
		}
	case opMarker:
		it.m.err = s.err
		close(it.m.done)
	}
}

// execCopy runs one copy that passed the checks at enqueue time.
func (e *Emulated) execCopy(kind CopyKind, c Copy) error {
	if f := e.fault.Load(); f != nil {
		if err := (*f)(kind, c); err != nil {
			return fmt.Errorf("emulated %v copy of %d bytes from %#x to %#x failed: %w",
				kind, c.Size, c.Src, c.Dst, err)
		}
	}
	memcopy.Copy(view(c.Dst, c.Size), view(c.Src, c.Size)) // as a copy engine: not through the caches
	return nil
}

// lookupStream finds a live stream; handle 0 is the legacy default stream,
// started on first use.
func (e *Emulated) lookupStream(op string, h Stream) (*stream, error) {
	if s := e.streams.load(uint64(h)); s != nil {
		return s, nil
	}
	e.mu.RLock()
	if e.closed {
		e.mu.RUnlock()
		return nil, errClosed(op)
	}
	if h == 0 && e.legacy != nil {
		s := e.legacy
		e.mu.RUnlock()
		return s, nil
	}
	e.mu.RUnlock()
	if h != 0 {
		return nil, NewError(op, ErrCodeInvalidHandle, fmt.Sprintf("unknown stream handle %d", h))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errClosed(op)
	}
	if e.legacy == nil {
		e.legacy = e.newStream(0, -1)
	}
	return e.legacy, nil
}

// StreamCreate makes a non-blocking stream on device, with its goroutine.
func (e *Emulated) StreamCreate(device int) (Stream, error) {
	const op = "cuStreamCreate"
	if err := e.checkDevice(op, device); err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, errClosed(op)
	}
	h := Stream(e.newHandle())
	e.streams.store(uint64(h), e.newStream(h, device))
	return h, nil
}

// StreamDestroy releases s at once: its handle becomes invalid, work already
// queued still runs, and then its goroutine exits. The legacy default
// stream (0) cannot be destroyed.
func (e *Emulated) StreamDestroy(h Stream) error {
	const op = "cuStreamDestroy"
	if h == 0 {
		return NewError(op, ErrCodeInvalidHandle, "the legacy default stream (0) cannot be destroyed")
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return errClosed(op)
	}
	s := e.streams.delete(uint64(h))
	e.mu.Unlock()
	if s == nil {
		return NewError(op, ErrCodeInvalidHandle, fmt.Sprintf("unknown stream handle %d", h))
	}
	s.destroy()
	return nil
}

// StreamSynchronize waits for the work queued on s before the call and
// returns the stream's sticky error, if any.
func (e *Emulated) StreamSynchronize(h Stream) error {
	const op = "cuStreamSynchronize"
	s, err := e.lookupStream(op, h)
	if err != nil {
		return err
	}
	m := newMarker()
	if err := s.push(op, item{op: opMarker, m: m}); err != nil {
		return err
	}
	<-m.done
	return m.err
}

// StreamWaitEvent makes work queued on s after the call wait until the
// work captured by ev's most recent record (at the time of the call) is
// complete. Recording ev again later does not change this wait. A wait on
// an event never recorded is a no-op. If the captured work failed, s takes
// on its error (see Emulated).
func (e *Emulated) StreamWaitEvent(h Stream, ev Event) error {
	const op = "cuStreamWaitEvent"
	s, err := e.lookupStream(op, h)
	if err != nil {
		return err
	}
	evt, err := e.lookupEvent(op, ev)
	if err != nil {
		return err
	}
	m := evt.capture()
	if m == nil {
		return nil
	}
	if done, err := m.complete(); done && err == nil {
		return nil // nothing to wait for
	}
	return s.push(op, item{op: opWait, m: m})
}

// MemcpyAsync checks c against the allocation tables and enqueues it on s.
// A zero-size copy is a no-op.
func (e *Emulated) MemcpyAsync(kind CopyKind, c Copy, h Stream) error {
	op := copyOp(kind)
	s, err := e.lookupStream(op, h)
	if err != nil {
		return err
	}
	if err := e.checkCopy(op, kind, c, -1, 0); err != nil {
		return err
	}
	if c.Size == 0 {
		return nil
	}
	return s.push(op, item{op: opCopy, kind: kind, c: c})
}

// MemcpyBatchAsync checks every copy and enqueues them on s as one queue
// item, executed in order. If any copy fails the checks nothing is
// enqueued. Zero-size copies are dropped; the slice is not retained.
func (e *Emulated) MemcpyBatchAsync(kind CopyKind, copies []Copy, h Stream) error {
	const op = "cuMemcpyBatchAsync"
	s, err := e.lookupStream(op, h)
	if err != nil {
		return err
	}
	n := 0
	for i, c := range copies {
		if err := e.checkCopy(op, kind, c, i, len(copies)); err != nil {
			return err
		}
		if c.Size != 0 {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if n == 1 { // one copy: an item of its own, nothing to allocate
		for _, c := range copies {
			if c.Size != 0 {
				return s.push(op, item{op: opCopy, kind: kind, c: c})
			}
		}
	}
	batch := make([]Copy, 0, n)
	for _, c := range copies {
		if c.Size != 0 {
			batch = append(batch, c)
		}
	}
	return s.push(op, item{op: opBatch, kind: kind, batch: batch})
}

func copyOp(kind CopyKind) string {
	switch kind {
	case HostToDevice:
		return "cuMemcpyHtoDAsync"
	case DeviceToHost:
		return "cuMemcpyDtoHAsync"
	case DeviceToDevice:
		return "cuMemcpyDtoDAsync"
	}
	return "cuMemcpyAsync"
}

// checkCopy checks c's kind and, for a non-empty copy, that its source and
// destination each lie within one range of the right table. A copy of a
// batch (index ≥ 0 of n) is named in the error; the name is formatted only
// then, since a batch may hold thousands of copies.
func (e *Emulated) checkCopy(op string, kind CopyKind, c Copy, index, n int) error {
	prefix := func() string {
		if index < 0 {
			return ""
		}
		return fmt.Sprintf("copy %d of %d: ", index, n)
	}
	var src, dst *regionTable
	switch kind {
	case HostToDevice:
		src, dst = &e.hosts, &e.devs
	case DeviceToHost:
		src, dst = &e.devs, &e.hosts
	case DeviceToDevice:
		src, dst = &e.devs, &e.devs
	default:
		return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("%sinvalid copy kind %v", prefix(), kind))
	}
	if c.Size == 0 {
		return nil
	}
	if src.lookup(c.Src, c.Size) == nil {
		return NewError(op, ErrCodeInvalidValue, fmt.Sprintf(
			"%s%v source range %#x..%#x (%d bytes) is not within one %s range",
			prefix(), kind, c.Src, c.Src+c.Size, c.Size, src.what))
	}
	if dst.lookup(c.Dst, c.Size) == nil {
		return NewError(op, ErrCodeInvalidValue, fmt.Sprintf(
			"%s%v destination range %#x..%#x (%d bytes) is not within one %s range",
			prefix(), kind, c.Dst, c.Dst+c.Size, c.Size, dst.what))
	}
	return nil
}
