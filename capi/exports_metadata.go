package main

/*
#include "kvbm.h"
*/
import "C"

import (
	"unsafe"

	"github.com/kvbm/kvbm/core/worker"
)

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
