package cuda

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Events of the emulated device. A record puts a marker in the stream's
// queue; the event refers to its newest marker.

type event struct {
	handle Event
	device int

	mu  sync.Mutex             // orders records
	rec atomic.Pointer[marker] // newest record; nil until recorded
}

// capture is the event's newest record, or nil if it was never recorded.
// It is read without mu: queries and synchronizations only look.
func (ev *event) capture() *marker { return ev.rec.Load() }

func (e *Emulated) lookupEvent(op string, h Event) (*event, error) {
	if ev := e.events.load(uint64(h)); ev != nil {
		return ev, nil
	}
	if err := e.checkOpen(op); err != nil {
		return nil, err
	}
	return nil, NewError(op, ErrCodeInvalidHandle, fmt.Sprintf("unknown event handle %d", h))
}

// EventCreate makes an event on device.
func (e *Emulated) EventCreate(device int) (Event, error) {
	const op = "cuEventCreate"
	if err := e.checkDevice(op, device); err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, errClosed(op)
	}
	h := Event(e.newHandle())
	e.events.store(uint64(h), &event{handle: h, device: device})
	return h, nil
}

// EventDestroy releases an event. Waits already enqueued on its records are
// unaffected.
func (e *Emulated) EventDestroy(h Event) error {
	const op = "cuEventDestroy"
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errClosed(op)
	}
	if e.events.delete(uint64(h)) == nil {
		return NewError(op, ErrCodeInvalidHandle, fmt.Sprintf("unknown event handle %d", h))
	}
	return nil
}

// EventRecord captures the work queued on s so far, replacing the event's
// previous capture. As with CUDA, the event and a created stream must
// belong to the same device (the legacy default stream takes any event).
func (e *Emulated) EventRecord(h Event, sh Stream) error {
	const op = "cuEventRecord"
	ev, err := e.lookupEvent(op, h)
	if err != nil {
		return err
	}
	s, err := e.lookupStream(op, sh)
	if err != nil {
		return err
	}
	if s.device >= 0 && s.device != ev.device {
		return NewError(op, ErrCodeInvalidHandle, fmt.Sprintf(
			"event %d is on device %d but stream %d is on device %d", h, ev.device, sh, s.device))
	}
	// Enqueue and publish under ev.mu, so that of two concurrent records the
	// one enqueued last is the event's capture.
	ev.mu.Lock()
	defer ev.mu.Unlock()
	m, err := s.record(op)
	if err != nil {
		return err
	}
	ev.rec.Store(m)
	return nil
}

// EventQuery reports whether the event's captured work is complete:
// (false, nil) while it is pending, (true, nil) when it succeeded, and
// (true, err) when it, or earlier work on its stream, failed. An event never
// recorded is complete.
func (e *Emulated) EventQuery(h Event) (bool, error) {
	ev, err := e.lookupEvent("cuEventQuery", h)
	if err != nil {
		return false, err
	}
	m := ev.capture()
	if m == nil {
		return true, nil
	}
	return m.complete()
}

// EventSynchronize blocks until the event's captured work is complete and
// returns its error, as EventQuery would then.
func (e *Emulated) EventSynchronize(h Event) error {
	ev, err := e.lookupEvent("cuEventSynchronize", h)
	if err != nil {
		return err
	}
	m := ev.capture()
	if m == nil {
		return nil
	}
	if done, err := m.complete(); done {
		return err // no lock: records on idle streams share one marker (reached)
	}
	<-m.done
	return m.err
}
