package main

/*
#include "kvbm.h"
*/
import "C"

import (
	"github.com/kvbm/kvbm/core/node"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
)

//export kvbmgo_worker_connect_remote
func kvbmgo_worker_connect_remote(h C.uintptr_t, instance C.uint64_t, p *C.uint8_t, n C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	md, st := bytesArg("worker_connect_remote", p, n)
	if st != statusOK {
		return st
	}
	return result(e.Worker().ConnectRemote(worker.InstanceID(instance), [][]byte{md}))
}

//export kvbmgo_worker_disconnect_remote
func kvbmgo_worker_disconnect_remote(h C.uintptr_t, instance C.uint64_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	return result(e.Worker().DisconnectRemote(worker.InstanceID(instance)))
}

//export kvbmgo_worker_transfer_from_instance
func kvbmgo_worker_transfer_from_instance(h C.uintptr_t, instance C.uint64_t, src C.int32_t, srcIDs *C.uint32_t,
	dst C.int32_t, dstIDs *C.uint32_t, n C.size_t, o *C.kvbm_transfer_options_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	s, d, opts, st := transferArgs("worker_transfer_from_instance", src, dst, srcIDs, dstIDs, n, o, out)
	if st != statusOK {
		return st
	}
	note, err := e.Worker().ExecuteRemoteOnboardForInstance(worker.InstanceID(instance), s, blockIDs(srcIDs, n), d,
		blockIDs(dstIDs, n), opts)
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}

//export kvbmgo_worker_transfer_from_remote
func kvbmgo_worker_transfer_from_remote(h C.uintptr_t, remote *C.kvbm_layout_handle_t, srcIDs *C.uint32_t, dst C.int32_t,
	dstIDs *C.uint32_t, n C.size_t, o *C.kvbm_transfer_options_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, rh, d, opts, st := remoteArgs("worker_transfer_from_remote", h, remote, dst, srcIDs, dstIDs, n, o, out)
	if st != statusOK {
		return st
	}
	note, err := e.Worker().ExecuteRemoteOnboard(worker.RemoteLayout(rh, blockIDs(srcIDs, n)), d, blockIDs(dstIDs, n), opts)
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}

//export kvbmgo_worker_transfer_to_remote
func kvbmgo_worker_transfer_to_remote(h C.uintptr_t, src C.int32_t, srcIDs *C.uint32_t, remote *C.kvbm_layout_handle_t,
	dstIDs *C.uint32_t, n C.size_t, o *C.kvbm_transfer_options_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, rh, s, opts, st := remoteArgs("worker_transfer_to_remote", h, remote, src, srcIDs, dstIDs, n, o, out)
	if st != statusOK {
		return st
	}
	note, err := e.Worker().ExecuteRemoteOffload(s, blockIDs(srcIDs, n), worker.RemoteLayout(rh, blockIDs(dstIDs, n)), opts)
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}

// remoteArgs checks the arguments of a transfer to or from another
// worker's layout: the worker, the remote handle, the local tier t and what
// every transfer takes.
func remoteArgs(what string, h C.uintptr_t, remote *C.kvbm_layout_handle_t, t C.int32_t, srcIDs, dstIDs *C.uint32_t,
	n C.size_t, o *C.kvbm_transfer_options_t, out *C.uintptr_t) (*node.Node, transfer.LayoutHandle, worker.Tier,
	transfer.Options, C.kvbm_status_t) {
	e, st := getWorker(h)
	if st != statusOK {
		return nil, transfer.LayoutHandle{}, 0, transfer.Options{}, st
	}
	if remote == nil {
		return nil, transfer.LayoutHandle{}, 0, transfer.Options{}, fail(errInvalidArgument, "%s: remote is NULL", what)
	}
	tr, _, opts, st := transferArgs(what, t, t, srcIDs, dstIDs, n, o, out)
	if st != statusOK {
		return nil, transfer.LayoutHandle{}, 0, transfer.Options{}, st
	}
	rh, err := transfer.UnpackHandle(uint64(remote.worker), uint64(remote.layout))
	if err != nil {
		return nil, transfer.LayoutHandle{}, 0, transfer.Options{}, failErr(err)
	}
	return e, rh, tr, opts, statusOK
}
