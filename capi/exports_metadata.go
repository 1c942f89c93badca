package main

/*
#include "kvbm.h"
*/
import "C"

import (
	"unsafe"

	"github.com/kvbm/kvbm/core/worker"
)

//export kvbmgo_worker_export_metadata
func kvbmgo_worker_export_metadata(h C.uintptr_t, buf *C.uint8_t, capacity C.size_t, size *C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	return exportMetadata(h, 0, buf, capacity, size)
}

//export kvbmgo_worker_export_metadata_scoped
func kvbmgo_worker_export_metadata_scoped(h C.uintptr_t, flags C.uint32_t, buf *C.uint8_t, capacity C.size_t, size *C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if flags&^C.KVBM_EXPORT_READ_ONLY != 0 {
		return fail(errInvalidArgument, "worker_export_metadata_scoped: unknown flags %#x", uint32(flags))
	}
	return exportMetadata(h, flags, buf, capacity, size)
}

func exportMetadata(h C.uintptr_t, flags C.uint32_t, buf *C.uint8_t, capacity C.size_t, size *C.size_t) C.kvbm_status_t {
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	if size == nil || (buf == nil && capacity > 0) {
		return fail(errInvalidArgument, "worker_export_metadata: size is NULL, or buf is NULL with capacity %d", capacity)
	}
	export := e.Worker().ExportMetadata
	if flags&C.KVBM_EXPORT_READ_ONLY != 0 {
		export = e.Worker().ExportReadOnlyMetadata
	}
	md, err := export()
	if err != nil {
		return failErr(err)
	}
	*size = C.size_t(len(md))
	if int(capacity) < len(md) {
		return fail(errBufferTooSmall, "worker_export_metadata: buffer of %d bytes, %d needed", capacity, len(md))
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(md)), md)
	return statusOK
}

// bytesArg copies a required C byte array.
func bytesArg(what string, p *C.uint8_t, n C.size_t) ([]byte, C.kvbm_status_t) {
	if p == nil || n == 0 {
		return nil, fail(errInvalidArgument, "%s: metadata is NULL or empty", what)
	}
	return C.GoBytes(unsafe.Pointer(p), C.int(n)), statusOK
}

//export kvbmgo_worker_import_metadata
func kvbmgo_worker_import_metadata(h C.uintptr_t, p *C.uint8_t, n C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	md, st := bytesArg("worker_import_metadata", p, n)
	if st != statusOK {
		return st
	}
	if _, err := e.Worker().ImportMetadata(md); err != nil {
		return failErr(err)
	}
	return statusOK
}

//export kvbmgo_metadata_worker_id
func kvbmgo_metadata_worker_id(p *C.uint8_t, n C.size_t, out *C.uint64_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if out == nil {
		return fail(errInvalidArgument, "metadata_worker_id: worker_id is NULL")
	}
	if p == nil || n == 0 {
		return fail(errInvalidArgument, "metadata_worker_id: metadata is NULL or len is 0 (len %d)", n)
	}
	md, err := worker.DecodeMetadata(unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n)))
	if err != nil {
		// The bytes are the caller's argument: malformed ones are an
		// invalid argument here, not corrupt data the library holds.
		return fail(errInvalidArgument, "metadata_worker_id: metadata of %d bytes: %v", n, err)
	}
	*out = C.uint64_t(md.WorkerID)
	return statusOK
}
