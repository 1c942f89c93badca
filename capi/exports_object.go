package main

/*
#include "kvbm.h"
*/
import "C"

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/kvbm/kvbm/core/node"
	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
)

// rawKeysArg checks num_keys C keys (non-NULL, 1 to KVBM_MAX_KEY_LEN
// bytes) and returns views of them, valid during the call only.
func rawKeysArg(what string, keys **C.uint8_t, lens *C.size_t, n C.size_t) ([][]byte, C.kvbm_status_t) {
	if keys == nil || lens == nil || n == 0 {
		return nil, fail(errInvalidArgument, "%s: keys and key_lens must not be NULL and num_keys not 0", what)
	}
	ps := unsafe.Slice(keys, int(n))
	ls := unsafe.Slice(lens, int(n))
	out := make([][]byte, len(ps))
	for i := range ps {
		if ps[i] == nil || ls[i] == 0 || ls[i] > C.KVBM_MAX_KEY_LEN {
			return nil, fail(errInvalidArgument, "%s: key %d is NULL or its length %d is not 1..%d", what, i, ls[i],
				C.KVBM_MAX_KEY_LEN)
		}
		out[i] = unsafe.Slice((*byte)(unsafe.Pointer(ps[i])), int(ls[i]))
	}
	return out, statusOK
}

// keysArg reads num_keys C keys as object keys (copies).
func keysArg(what string, keys **C.uint8_t, lens *C.size_t, n C.size_t) ([]object.Key, C.kvbm_status_t) {
	raw, st := rawKeysArg(what, keys, lens, n)
	if st != statusOK {
		return nil, st
	}
	out := make([]object.Key, len(raw))
	for i, b := range raw {
		k, err := object.NewKey(b)
		if err != nil {
			return nil, failErr(err)
		}
		out[i] = k
	}
	return out, statusOK
}

//export kvbmgo_worker_object_has
func kvbmgo_worker_object_has(h C.uintptr_t, keys **C.uint8_t, lens *C.size_t, n C.size_t, found *C.uint8_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	ks, st := keysArg("worker_object_has", keys, lens, n)
	if st != statusOK {
		return st
	}
	if found == nil {
		return fail(errInvalidArgument, "worker_object_has: found is NULL")
	}
	out := unsafe.Slice(found, int(n))
	// A key whose object cannot be used (corrupt, truncated, unreadable)
	// is not found; the call still succeeds, and the last error says why.
	unusable, first, firstAt := 0, error(nil), 0
	for i, p := range e.Worker().HasBlocks(context.Background(), ks) {
		out[i] = 0
		if p.Found {
			out[i] = 1
		}
		if p.Err != nil {
			if unusable == 0 {
				first, firstAt = p.Err, i
			}
			unusable++
		}
	}
	if unusable > 0 {
		setError(fmt.Sprintf("kvbm: worker_object_has: %d of %d keys name objects that cannot be used (found = 0); key at index %d: %v",
			unusable, n, firstAt, first))
		return statusOK
	}
	setError("")
	return statusOK
}

// objectArgs checks the arguments every object call shares: the worker,
// the keys, the tier and the block ids.
func objectArgs(what string, h C.uintptr_t, keys **C.uint8_t, lens *C.size_t, n C.size_t, t C.int32_t,
	ids *C.uint32_t) (*node.Node, []object.Key, worker.Tier, C.kvbm_status_t) {
	e, st := getWorker(h)
	if st != statusOK {
		return nil, nil, 0, st
	}
	ks, st := keysArg(what, keys, lens, n)
	if st != statusOK {
		return nil, nil, 0, st
	}
	tr, ok := tier(t)
	if ids == nil || !ok {
		return nil, nil, 0, fail(errInvalidArgument, "%s: block_ids is NULL or tier %d is not KVBM_TIER_G1..G3", what, t)
	}
	return e, ks, tr, statusOK
}

//export kvbmgo_worker_object_put
func kvbmgo_worker_object_put(h C.uintptr_t, keys **C.uint8_t, lens *C.size_t, n C.size_t, t C.int32_t,
	ids *C.uint32_t, statuses *C.kvbm_status_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, ks, tr, st := objectArgs("worker_object_put", h, keys, lens, n, t, ids)
	if st != statusOK {
		return st
	}
	return objectResults(e.Worker().PutBlocks(context.Background(), ks, tr, blockIDs(ids, n)), statuses, n)
}

//export kvbmgo_worker_object_get
func kvbmgo_worker_object_get(h C.uintptr_t, keys **C.uint8_t, lens *C.size_t, n C.size_t, t C.int32_t,
	ids *C.uint32_t, statuses *C.kvbm_status_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, ks, tr, st := objectArgs("worker_object_get", h, keys, lens, n, t, ids)
	if st != statusOK {
		return st
	}
	return objectResults(e.Worker().GetBlocks(context.Background(), ks, tr, blockIDs(ids, n)), statuses, n)
}

// objectResults writes each block's status into statuses (when not NULL)
// and returns the first failed block's, with its message.
func objectResults(results []object.Result, statuses *C.kvbm_status_t, n C.size_t) C.kvbm_status_t {
	var out []C.kvbm_status_t
	if statuses != nil {
		out = unsafe.Slice(statuses, int(n))
	}
	var first error
	for i, r := range results {
		if out != nil {
			out[i] = statusOf(r.Err)
		}
		if r.Err != nil && first == nil {
			first = r.Err
		}
	}
	return result(first)
}

//export kvbmgo_worker_onboard_objects
func kvbmgo_worker_onboard_objects(h C.uintptr_t, keys **C.uint8_t, lens *C.size_t, n C.size_t, dst C.int32_t,
	ids *C.uint32_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if out == nil {
		return fail(errInvalidArgument, "worker_onboard_objects: notification is NULL")
	}
	e, ks, tr, st := objectArgs("worker_onboard_objects", h, keys, lens, n, dst, ids)
	if st != statusOK {
		return st
	}
	note, err := e.Worker().ExecuteRemoteOnboard(worker.RemoteObjects(ks), tr, blockIDs(ids, n), transfer.Options{})
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}

//export kvbmgo_worker_offload_objects
func kvbmgo_worker_offload_objects(h C.uintptr_t, src C.int32_t, ids *C.uint32_t, keys **C.uint8_t, lens *C.size_t,
	n C.size_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if out == nil {
		return fail(errInvalidArgument, "worker_offload_objects: notification is NULL")
	}
	e, ks, tr, st := objectArgs("worker_offload_objects", h, keys, lens, n, src, ids)
	if st != statusOK {
		return st
	}
	note, err := e.Worker().ExecuteRemoteOffload(tr, blockIDs(ids, n), worker.RemoteObjects(ks), transfer.Options{})
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}
