package main

/*
#include "kvbm.h"
*/
import "C"

import (
	"github.com/kvbm/kvbm/capi/internal/handles"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
)

func getCoordinated(h C.uintptr_t) (*worker.CoordinatedWorker, C.kvbm_status_t) {
	return lookup[*worker.CoordinatedWorker](h, kindCoordinated, "coordinated worker")
}

//export kvbmgo_coordinated_create
func kvbmgo_coordinated_create(inner C.uintptr_t, rank C.int32_t, host C.uint64_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(inner)
	if st != statusOK {
		return st
	}
	if out == nil {
		return fail(errInvalidArgument, "coordinated_create: coordinated is NULL")
	}
	c := worker.NewCoordinated(e.Worker(), int(rank), worker.InstanceID(host))
	*out = C.uintptr_t(table.Add(kindCoordinated, c))
	return statusOK
}

//export kvbmgo_coordinated_destroy
func kvbmgo_coordinated_destroy(h C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if _, ok := table.Remove(handles.Handle(h), kindCoordinated); !ok {
		return badHandle("coordinated worker", h)
	}
	return statusOK
}

//export kvbmgo_coordinated_set_local
func kvbmgo_coordinated_set_local(h C.uintptr_t, t C.int32_t, lh *C.kvbm_layout_handle_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	c, st := getCoordinated(h)
	if st != statusOK {
		return st
	}
	tr, ok := tier(t)
	if lh == nil || !ok {
		return fail(errInvalidArgument, "coordinated_set_local: handle is NULL or tier %d is not KVBM_TIER_G1..G3", t)
	}
	layoutHandle, err := transfer.UnpackHandle(uint64(lh.worker), uint64(lh.layout))
	if err != nil {
		return failErr(err)
	}
	return result(c.SetLocal(tr, layoutHandle))
}

//export kvbmgo_coordinated_apply_layout_response
func kvbmgo_coordinated_apply_layout_response(h C.uintptr_t, p *C.uint8_t, n C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	c, st := getCoordinated(h)
	if st != statusOK {
		return st
	}
	md, st := bytesArg("coordinated_apply_layout_response", p, n)
	if st != statusOK {
		return st
	}
	return result(c.ApplyLayoutResponse(md))
}

//export kvbmgo_coordinated_import_remote_metadata
func kvbmgo_coordinated_import_remote_metadata(h C.uintptr_t, leader C.uint64_t, rank C.int32_t, p *C.uint8_t,
	n C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	c, st := getCoordinated(h)
	if st != statusOK {
		return st
	}
	md, st := bytesArg("coordinated_import_remote_metadata", p, n)
	if st != statusOK {
		return st
	}
	return result(c.ImportRemoteMetadata(worker.InstanceID(leader), int(rank), md))
}

//export kvbmgo_coordinated_resolve_remote_handle
func kvbmgo_coordinated_resolve_remote_handle(h C.uintptr_t, leader C.uint64_t, rank C.int32_t, t C.int32_t,
	out *C.kvbm_layout_handle_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	c, st := getCoordinated(h)
	if st != statusOK {
		return st
	}
	tr, ok := tier(t)
	if out == nil || !ok {
		return fail(errInvalidArgument, "coordinated_resolve_remote_handle: handle is NULL or tier %d is not KVBM_TIER_G1..G3", t)
	}
	lh, found := c.ResolveRemoteHandle(worker.InstanceID(leader), int(rank), tr)
	if !found {
		return fail(errNotFound, "coordinated_resolve_remote_handle: no %v handle for leader %#x rank %d", tr, uint64(leader), rank)
	}
	writeLayoutHandle(out, lh)
	return statusOK
}

//export kvbmgo_coordinated_transfer_from_remote
func kvbmgo_coordinated_transfer_from_remote(h C.uintptr_t, leader C.uint64_t, rank C.int32_t, src C.int32_t,
	srcIDs *C.uint32_t, dst C.int32_t, dstIDs *C.uint32_t, n C.size_t, o *C.kvbm_transfer_options_t,
	out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	c, st := getCoordinated(h)
	if st != statusOK {
		return st
	}
	s, d, opts, st := transferArgs("coordinated_transfer_from_remote", src, dst, srcIDs, dstIDs, n, o, out)
	if st != statusOK {
		return st
	}
	note, err := c.TransferFromRemote(worker.InstanceID(leader), int(rank), s, blockIDs(srcIDs, n), d, blockIDs(dstIDs, n), opts)
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}
