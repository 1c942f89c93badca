package main

/*
#include "kvbm.h"
*/
import "C"

import "github.com/kvbm/kvbm/cuda"

// driver returns the process-wide device driver, recording the error.
func driver() (cuda.Driver, C.kvbm_status_t) {
	drv, err := cuda.Default()
	if err != nil {
		return nil, failErr(err)
	}
	return drv, statusOK
}

// withDriver runs one driver call and maps its result.
func withDriver(call func(cuda.Driver) error) C.kvbm_status_t {
	drv, st := driver()
	if st != statusOK {
		return st
	}
	return result(call(drv))
}

//export kvbmgo_stream_create
func kvbmgo_stream_create(device C.int32_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if out == nil {
		return fail(errInvalidArgument, "stream_create: stream is NULL")
	}
	return withDriver(func(drv cuda.Driver) error {
		s, err := drv.StreamCreate(int(device))
		if err == nil {
			*out = C.uintptr_t(s)
		}
		return err
	})
}

//export kvbmgo_stream_destroy
func kvbmgo_stream_destroy(s C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if s == 0 {
		return fail(errInvalidArgument, "stream_destroy: the legacy default stream (NULL) cannot be destroyed")
	}
	return withDriver(func(drv cuda.Driver) error { return drv.StreamDestroy(cuda.Stream(s)) })
}

//export kvbmgo_stream_synchronize
func kvbmgo_stream_synchronize(s C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	return withDriver(func(drv cuda.Driver) error { return drv.StreamSynchronize(cuda.Stream(s)) })
}

//export kvbmgo_stream_wait_event
func kvbmgo_stream_wait_event(s, e C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	return withDriver(func(drv cuda.Driver) error { return drv.StreamWaitEvent(cuda.Stream(s), cuda.Event(e)) })
}

//export kvbmgo_event_create
func kvbmgo_event_create(device C.int32_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if out == nil {
		return fail(errInvalidArgument, "event_create: event is NULL")
	}
	return withDriver(func(drv cuda.Driver) error {
		e, err := drv.EventCreate(int(device))
		if err == nil {
			*out = C.uintptr_t(e)
		}
		return err
	})
}

//export kvbmgo_event_destroy
func kvbmgo_event_destroy(e C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	return withDriver(func(drv cuda.Driver) error { return drv.EventDestroy(cuda.Event(e)) })
}

//export kvbmgo_event_record
func kvbmgo_event_record(e, s C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	return withDriver(func(drv cuda.Driver) error { return drv.EventRecord(cuda.Event(e), cuda.Stream(s)) })
}

//export kvbmgo_event_query
func kvbmgo_event_query(e C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	done := false
	if st := withDriver(func(drv cuda.Driver) (err error) {
		done, err = drv.EventQuery(cuda.Event(e))
		return err
	}); st != statusOK {
		return st
	}
	if !done {
		return statusInProgress
	}
	return statusOK
}

//export kvbmgo_event_synchronize
func kvbmgo_event_synchronize(e C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	return withDriver(func(drv cuda.Driver) error { return drv.EventSynchronize(cuda.Event(e)) })
}
