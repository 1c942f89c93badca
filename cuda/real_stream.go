//go:build cgo

package cuda

/*
#include "real_trampolines.h"
*/
import "C"

// Streams and events of the real driver. Handles are the driver's own, so
// an engine's streams and events work wherever ours do.

// StreamCreate makes a CU_STREAM_NON_BLOCKING stream in device's primary
// context.
func (r *Real) StreamCreate(device int) (Stream, error) {
	const op = "cuStreamCreate"
	d, err := r.device(op, device)
	if err != nil {
		return 0, err
	}
	var s C.uint64_t
	if err := check(op, C.kv_cuStreamCreate(C.uint64_t(d.ctx), &s, cuStreamNonBlocking)); err != nil {
		return 0, err
	}
	return Stream(s), nil
}

// StreamDestroy releases s; work already queued on it still runs (CUDA's
// rule). The legacy default stream (0) cannot be destroyed.
func (r *Real) StreamDestroy(s Stream) error {
	const op = "cuStreamDestroy"
	if err := r.checkOpen(op); err != nil {
		return err
	}
	if s == 0 {
		return NewError(op, ErrCodeInvalidHandle, "the legacy default stream (0) cannot be destroyed")
	}
	return check(op, C.kv_cuStreamDestroy(r.anyCtx(), C.uint64_t(s)))
}

// StreamSynchronize waits for the work queued on s, polling cuStreamQuery.
func (r *Real) StreamSynchronize(s Stream) error {
	const op = "cuStreamSynchronize"
	if err := r.checkOpen(op); err != nil {
		return err
	}
	return poll(func() (bool, error) {
		return done("cuStreamQuery", C.kv_cuStreamQuery(r.anyCtx(), C.uint64_t(s)))
	})
}

// StreamWaitEvent makes later work on s wait for e's most recent record.
func (r *Real) StreamWaitEvent(s Stream, e Event) error {
	const op = "cuStreamWaitEvent"
	if err := r.checkOpen(op); err != nil {
		return err
	}
	return check(op, C.kv_cuStreamWaitEvent(r.anyCtx(), C.uint64_t(s), C.uint64_t(e)))
}

// EventCreate makes a CU_EVENT_DISABLE_TIMING event in device's primary
// context.
func (r *Real) EventCreate(device int) (Event, error) {
	const op = "cuEventCreate"
	d, err := r.device(op, device)
	if err != nil {
		return 0, err
	}
	var e C.uint64_t
	if err := check(op, C.kv_cuEventCreate(C.uint64_t(d.ctx), &e, cuEventDisableTiming)); err != nil {
		return 0, err
	}
	return Event(e), nil
}

// EventDestroy releases e.
func (r *Real) EventDestroy(e Event) error {
	const op = "cuEventDestroy"
	if err := r.checkOpen(op); err != nil {
		return err
	}
	return check(op, C.kv_cuEventDestroy(r.anyCtx(), C.uint64_t(e)))
}

// EventRecord captures the work queued on s so far.
func (r *Real) EventRecord(e Event, s Stream) error {
	const op = "cuEventRecord"
	if err := r.checkOpen(op); err != nil {
		return err
	}
	return check(op, C.kv_cuEventRecord(r.anyCtx(), C.uint64_t(e), C.uint64_t(s)))
}

// EventQuery reports whether e's captured work is complete: (false, nil)
// while pending, (true, nil) when done, (true, err) when the driver reports
// a failure (in CUDA, a sticky error of the context).
func (r *Real) EventQuery(e Event) (bool, error) {
	const op = "cuEventQuery"
	if err := r.checkOpen(op); err != nil {
		return false, err
	}
	return done(op, C.kv_cuEventQuery(r.anyCtx(), C.uint64_t(e)))
}

// EventSynchronize waits for e's captured work, polling cuEventQuery (see
// poll: yields for the first 50 µs, then sleeps with a growing interval):
// it parks the goroutine, never an OS thread.
func (r *Real) EventSynchronize(e Event) error {
	const op = "cuEventSynchronize"
	if err := r.checkOpen(op); err != nil {
		return err
	}
	return poll(func() (bool, error) {
		return done("cuEventQuery", C.kv_cuEventQuery(r.anyCtx(), C.uint64_t(e)))
	})
}

// done maps a query's CUresult: NOT_READY is pending, anything else final.
func done(op string, res C.int) (bool, error) {
	if int(res) == cuNotReady {
		return false, nil
	}
	return true, check(op, res)
}
