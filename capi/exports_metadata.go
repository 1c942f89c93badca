package main

/*
#include "kvbm.h"
*/
import "C"

import (
	"time"
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
	export := e.Worker().ExportMetadata
	if flags&C.KVBM_EXPORT_READ_ONLY != 0 {
		export = e.Worker().ExportReadOnlyMetadata
	}
	return writeMetadata("worker_export_metadata", export, buf, capacity, size)
}

//export kvbmgo_worker_export_metadata_blocks
func kvbmgo_worker_export_metadata_blocks(h C.uintptr_t, scope *C.kvbm_block_scope_t, buf *C.uint8_t, capacity C.size_t, size *C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	const what = "worker_export_metadata_blocks"
	blocks, st := scopeBlocks(what, scope)
	if st != statusOK {
		return st
	}
	s := worker.BlockScope{Blocks: blocks}
	if scope.expires_ms > 0 {
		s.Expires = time.Now().Add(time.Duration(scope.expires_ms) * time.Millisecond)
	}
	return writeMetadata(what, func() ([]byte, error) { return e.Worker().ExportBlockScopedMetadata(s) }, buf, capacity, size)
}

// scopeBlocks reads a block scope's blocks by tier, checking the struct
// and its tiers (the block ids are the worker's to check).
func scopeBlocks(what string, scope *C.kvbm_block_scope_t) (map[worker.Tier][]int, C.kvbm_status_t) {
	switch {
	case scope == nil:
		return nil, fail(errInvalidArgument, "%s: scope is NULL", what)
	case scope.struct_size < C.sizeof_kvbm_block_scope_t:
		return nil, fail(errInvalidArgument, "%s: struct_size %d is less than %d (use KVBM_BLOCK_SCOPE_INIT)", what, scope.struct_size, C.sizeof_kvbm_block_scope_t)
	case scope.tiers == nil || scope.block_ids == nil || scope.num_blocks == 0:
		return nil, fail(errInvalidArgument, "%s: tiers or block_ids is NULL, or num_blocks is 0", what)
	}
	ids := blockIDs(scope.block_ids, scope.num_blocks)
	tiers := unsafe.Slice(scope.tiers, len(ids))
	blocks := map[worker.Tier][]int{}
	for i, id := range ids {
		t, ok := tier(tiers[i])
		if !ok {
			return nil, fail(errInvalidArgument, "%s: tiers[%d] is %d: want KVBM_TIER_G1..G3", what, i, tiers[i])
		}
		blocks[t] = append(blocks[t], id)
	}
	return blocks, statusOK
}

//export kvbmgo_worker_revoke_blocks
func kvbmgo_worker_revoke_blocks(h C.uintptr_t, scope *C.kvbm_block_scope_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	blocks, st := scopeBlocks("worker_revoke_blocks", scope)
	if st != statusOK {
		return st
	}
	if err := e.Worker().RevokeBlocks(blocks); err != nil {
		return failErr(err)
	}
	return statusOK
}

// writeMetadata exports metadata into the caller's buffer, or says how
// large it must be.
func writeMetadata(what string, export func() ([]byte, error), buf *C.uint8_t, capacity C.size_t, size *C.size_t) C.kvbm_status_t {
	if size == nil || (buf == nil && capacity > 0) {
		return fail(errInvalidArgument, "%s: size is NULL, or buf is NULL with capacity %d", what, capacity)
	}
	md, err := export()
	if err != nil {
		return failErr(err)
	}
	*size = C.size_t(len(md))
	if int(capacity) < len(md) {
		return fail(errBufferTooSmall, "%s: buffer of %d bytes, %d needed", what, capacity, len(md))
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
