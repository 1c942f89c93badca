package main

/*
#include "kvbm.h"
*/
import "C"

import (
	"time"
	"unsafe"

	"github.com/kvbm/kvbm/capi/internal/handles"
	"github.com/kvbm/kvbm/core/transfer"
)

func getNotification(h C.uintptr_t) (*transfer.Notification, C.kvbm_status_t) {
	return lookup[*transfer.Notification](h, kindNotification, "notification")
}

//export kvbmgo_notification_poll
func kvbmgo_notification_poll(h C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	n, st := getNotification(h)
	if st != statusOK {
		return st
	}
	done, err := n.Poll()
	if !done {
		return statusInProgress
	}
	if err != nil {
		return failErr(err)
	}
	return statusOK
}

//export kvbmgo_notification_wait
func kvbmgo_notification_wait(h C.uintptr_t, timeoutMs C.int64_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	n, st := getNotification(h)
	if st != statusOK {
		return st
	}
	timeout := time.Duration(-1)
	if timeoutMs >= 0 {
		timeout = time.Duration(timeoutMs) * time.Millisecond
	}
	return result(n.WaitTimeout(timeout))
}

//export kvbmgo_notification_cancel
func kvbmgo_notification_cancel(h C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	n, st := getNotification(h)
	if st != statusOK {
		return st
	}
	n.Cancel()
	return statusOK
}

//export kvbmgo_notification_failed_blocks
func kvbmgo_notification_failed_blocks(h C.uintptr_t, ids *C.uint32_t, capacity C.size_t, count *C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	n, st := getNotification(h)
	if st != statusOK {
		return st
	}
	if count == nil || (ids == nil && capacity > 0) {
		return fail(errInvalidArgument, "notification_failed_blocks: count is NULL, or ids is NULL with capacity %d", capacity)
	}
	failed := n.FailedBlocks()
	*count = C.size_t(len(failed))
	if int(capacity) < len(failed) {
		return fail(errBufferTooSmall, "notification_failed_blocks: room for %d ids, %d failed", capacity, len(failed))
	}
	if len(failed) > 0 {
		out := unsafe.Slice(ids, len(failed))
		for i, id := range failed {
			out[i] = C.uint32_t(id)
		}
	}
	return statusOK
}

//export kvbmgo_notification_free
func kvbmgo_notification_free(h C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if _, ok := table.Remove(handles.Handle(h), kindNotification); !ok {
		return badHandle("notification", h)
	}
	return statusOK
}
