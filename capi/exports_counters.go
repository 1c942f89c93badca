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
	// Callers built before the remote paths pass room for 7 paths; they get 7.
	pathsOff, pathSize := unsafe.Offsetof(out.paths), unsafe.Sizeof(out.paths[0])
	if out == nil || out.struct_size < C.size_t(pathsOff+7*pathSize) {
		return fail(errInvalidArgument, "worker_counters: counters is NULL or its struct_size is less than %d (use KVBM_COUNTERS_INIT)",
			pathsOff+7*pathSize)
	}
	n := min(int((uintptr(out.struct_size)-pathsOff)/pathSize), C.KVBM_PATH_COUNT)
	paths := unsafe.Slice(&out.paths[0], n)
	all := e.Worker().Counters()
	for i, c := range all[:n] {
		paths[i] = C.kvbm_path_counters_t{transfers: C.uint64_t(c.Transfers), blocks: C.uint64_t(c.Blocks),
			bytes: C.uint64_t(c.Bytes), failed_blocks: C.uint64_t(c.FailedBlocks), nanoseconds: C.uint64_t(c.Nanoseconds)}
	}
	return statusOK
}
