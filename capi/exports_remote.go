package main

/*
#include "kvbm.h"
*/
import "C"

import (
	"unsafe"

	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
)

// kvbmgo_worker_transfer_remote serves kvbm_worker_transfer_from_remote
// (push 0: remote → local tier t) and kvbm_worker_transfer_to_remote
// (push 1: local tier t → remote).
//
//export kvbmgo_worker_transfer_remote
func kvbmgo_worker_transfer_remote(h C.uintptr_t, push C.int, remote *C.kvbm_layout_handle_t, t C.int32_t,
	srcIDs, dstIDs *C.uint32_t, n C.size_t, o *C.kvbm_transfer_options_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	what := "worker_transfer_from_remote"
	if push != 0 {
		what = "worker_transfer_to_remote"
	}
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	if remote == nil {
		return fail(errInvalidArgument, "%s: remote is NULL", what)
	}
	tr, _, opts, st := transferArgs(what, t, t, srcIDs, dstIDs, n, o, out)
	if st != statusOK {
		return st
	}
	rh, err := transfer.UnpackHandle(uint64(remote.worker), uint64(remote.layout))
	if err != nil {
		return failErr(err)
	}
	var note *transfer.Notification
	if push != 0 {
		note, err = e.w.ExecuteRemoteOffload(tr, blockIDs(srcIDs, n), worker.RemoteLayout(rh, blockIDs(dstIDs, n)), opts)
	} else {
		note, err = e.w.ExecuteRemoteOnboard(worker.RemoteLayout(rh, blockIDs(srcIDs, n)), tr, blockIDs(dstIDs, n), opts)
	}
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}

// kvbmgo_worker_objects_async serves kvbm_worker_onboard_objects (put 0)
// and kvbm_worker_offload_objects (put 1).
//
//export kvbmgo_worker_objects_async
func kvbmgo_worker_objects_async(h C.uintptr_t, put C.int, keys **C.uint8_t, lens *C.size_t, n C.size_t, t C.int32_t,
	ids *C.uint32_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	what := "worker_onboard_objects"
	if put != 0 {
		what = "worker_offload_objects"
	}
	if out == nil {
		return fail(errInvalidArgument, "%s: notification is NULL", what)
	}
	e, ks, tr, st := objectArgs(what, h, keys, lens, n, t, ids)
	if st != statusOK {
		return st
	}
	var note *transfer.Notification
	var err error
	if put != 0 {
		note, err = e.w.ExecuteRemoteOffload(tr, blockIDs(ids, n), worker.RemoteObjects(ks), transfer.Options{})
	} else {
		note, err = e.w.ExecuteRemoteOnboard(worker.RemoteObjects(ks), tr, blockIDs(ids, n), transfer.Options{})
	}
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}

//export kvbmgo_worker_counters
func kvbmgo_worker_counters(h C.uintptr_t, out *C.kvbm_counters_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	if out == nil || out.struct_size < C.sizeof_kvbm_counters_t {
		return fail(errInvalidArgument, "worker_counters: counters is NULL or its struct_size is less than %d (use KVBM_COUNTERS_INIT)",
			C.sizeof_kvbm_counters_t)
	}
	paths := unsafe.Slice(&out.paths[0], C.KVBM_PATH_COUNT)
	for i, c := range e.w.Manager().Counters() {
		paths[i] = C.kvbm_path_counters_t{transfers: C.uint64_t(c.Transfers), blocks: C.uint64_t(c.Blocks),
			bytes: C.uint64_t(c.Bytes), failed_blocks: C.uint64_t(c.FailedBlocks), nanoseconds: C.uint64_t(c.Nanoseconds)}
	}
	return statusOK
}
