package main

/*
#include "kvbm.h"
*/
import "C"

import "unsafe"

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
	for i, c := range e.w.Counters() {
		paths[i] = C.kvbm_path_counters_t{transfers: C.uint64_t(c.Transfers), blocks: C.uint64_t(c.Blocks),
			bytes: C.uint64_t(c.Bytes), failed_blocks: C.uint64_t(c.FailedBlocks), nanoseconds: C.uint64_t(c.Nanoseconds)}
	}
	return statusOK
}
