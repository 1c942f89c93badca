package main

/*
#include <stdlib.h>
#include "kvbm.h"
*/
import "C"

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/kvbm/kvbm/capi/internal/handles"
	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
)

// workerEntry is what a kvbm_worker_t names.
type workerEntry struct {
	w *worker.PhysicalWorker
}

func getWorker(h C.uintptr_t) (*workerEntry, C.kvbm_status_t) {
	return lookup[*workerEntry](h, kindWorker, "worker")
}

// blockIDs copies a C array of n block ids.
func blockIDs(p *C.uint32_t, n C.size_t) []int {
	src := unsafe.Slice(p, int(n))
	ids := make([]int, len(src))
	for i, v := range src {
		ids[i] = int(v)
	}
	return ids
}

// tier checks a C tier value; core decides which tiers an operation takes.
func tier(t C.int32_t) (worker.Tier, bool) {
	return worker.Tier(t), t >= C.int32_t(worker.G1) && t <= C.int32_t(worker.G4)
}

// layoutConfig reads a kvbm_layout_config_t.
func layoutConfig(what string, c *C.kvbm_layout_config_t) (layout.Config, transfer.Shape, C.kvbm_status_t) {
	if c == nil {
		return layout.Config{}, transfer.Shape{}, fail(errInvalidArgument, "%s: config is NULL", what)
	}
	if c.struct_size < C.sizeof_kvbm_layout_config_t {
		return layout.Config{}, transfer.Shape{}, fail(errInvalidArgument,
			"%s: config struct_size %d is less than %d (use KVBM_LAYOUT_CONFIG_INIT)", what, c.struct_size,
			C.sizeof_kvbm_layout_config_t)
	}
	if c.layout_kind < 0 || c.layout_kind > 255 || c.block_dim < 0 || c.block_dim > 255 {
		return layout.Config{}, transfer.Shape{}, fail(errInvalidArgument,
			"%s: layout_kind %d or block_dim %d out of range", what, c.layout_kind, c.block_dim)
	}
	cfg := layout.Config{
		NumBlocks: int(c.num_blocks), NumLayers: int(c.num_layers), OuterDim: int(c.outer_dim),
		PageSize: int(c.page_size), InnerDim: int(c.inner_dim), DtypeWidth: int(c.dtype_width),
	}
	shape := transfer.Shape{Kind: layout.Kind(c.layout_kind), BlockDim: layout.BlockDim(c.block_dim)}
	return cfg, shape, statusOK
}

// transferOptions reads a kvbm_transfer_options_t (NULL: defaults).
func transferOptions(what string, o *C.kvbm_transfer_options_t) (transfer.Options, C.kvbm_status_t) {
	var opts transfer.Options
	if o == nil {
		return opts, statusOK
	}
	if o.struct_size < C.sizeof_kvbm_transfer_options_t {
		return opts, fail(errInvalidArgument, "%s: options struct_size %d is less than %d (use KVBM_TRANSFER_OPTIONS_INIT)",
			what, o.struct_size, C.sizeof_kvbm_transfer_options_t)
	}
	if o.layer_start != 0 || o.layer_end != 0 {
		opts.Layers = transfer.Layers(int(o.layer_start), int(o.layer_end))
	}
	// Streams and events are raw driver handles, read as integers so that
	// Go never holds them in pointer-typed variables.
	if s := *(*uintptr)(unsafe.Pointer(&o.stream)); s != 0 {
		opts.Stream = transfer.StreamOf(cuda.Stream(s))
	}
	opts.Precondition = cuda.Event(*(*uintptr)(unsafe.Pointer(&o.precondition)))
	return opts, statusOK
}

func writeLayoutHandle(out *C.kvbm_layout_handle_t, h transfer.LayoutHandle) {
	if out != nil {
		hi, lo := h.Pack()
		out.worker, out.layout = C.uint64_t(hi), C.uint64_t(lo)
	}
}

// addNotification issues a handle for a notification.
func addNotification(n *transfer.Notification, out *C.uintptr_t) C.kvbm_status_t {
	*out = C.uintptr_t(table.Add(kindNotification, n))
	return statusOK
}

//export kvbmgo_worker_create
func kvbmgo_worker_create(cfg *C.kvbm_worker_config_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if cfg == nil || out == nil {
		return fail(errInvalidArgument, "worker_create: config and worker must not be NULL")
	}
	if cfg.struct_size < C.sizeof_kvbm_worker_config_t {
		return fail(errInvalidArgument, "worker_create: struct_size %d is less than %d (use KVBM_WORKER_CONFIG_INIT)",
			cfg.struct_size, C.sizeof_kvbm_worker_config_t)
	}
	drv, st := driver()
	if st != statusOK {
		return st
	}
	sc := worker.StandaloneConfig{WorkerID: uint64(cfg.worker_id), Device: int(cfg.device_id), Rank: int(cfg.rank),
		Driver: drv, Loopback: loopback}
	if cfg.disk_dir != nil {
		sc.DiskDir = C.GoString(cfg.disk_dir)
	}
	if cfg.object_dir != nil {
		sc.ObjectDir = C.GoString(cfg.object_dir)
	}
	w, err := worker.NewStandalone(sc)
	if err != nil {
		return failErr(err)
	}
	*out = C.uintptr_t(table.Add(kindWorker, &workerEntry{w: w}))
	return statusOK
}

//export kvbmgo_worker_destroy
func kvbmgo_worker_destroy(h C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	v, ok := table.Remove(handles.Handle(h), kindWorker)
	if !ok {
		return badHandle("worker", h)
	}
	return result(v.(*workerEntry).w.Close())
}

//export kvbmgo_worker_register_g1
func kvbmgo_worker_register_g1(h C.uintptr_t, c *C.kvbm_layout_config_t, ptrs *C.uint64_t, n C.size_t,
	out *C.kvbm_layout_handle_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	if ptrs == nil || n == 0 {
		return fail(errInvalidArgument, "worker_register_g1: ptrs is NULL or num_ptrs is 0")
	}
	cfg, shape, st := layoutConfig("worker_register_g1", c)
	if st != statusOK {
		return st
	}
	src := unsafe.Slice(ptrs, int(n))
	p := make([]uint64, len(src))
	for i, v := range src {
		p[i] = uint64(v)
	}
	lh, err := e.w.RegisterG1(cfg, shape, p)
	if err != nil {
		return failErr(err)
	}
	writeLayoutHandle(out, lh)
	return statusOK
}

//export kvbmgo_worker_allocate
func kvbmgo_worker_allocate(h C.uintptr_t, t C.int32_t, c *C.kvbm_layout_config_t, out *C.kvbm_layout_handle_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	what := "worker_allocate_g2"
	alloc := e.w.AllocateG2
	if worker.Tier(t) == worker.G3 {
		what, alloc = "worker_allocate_g3", e.w.AllocateG3
	}
	cfg, shape, st := layoutConfig(what, c)
	if st != statusOK {
		return st
	}
	lh, err := alloc(cfg, shape)
	if err != nil {
		return failErr(err)
	}
	writeLayoutHandle(out, lh)
	return statusOK
}

// transferArgs checks the arguments every transfer call shares.
func transferArgs(what string, src, dst C.int32_t, srcIDs, dstIDs *C.uint32_t, n C.size_t,
	o *C.kvbm_transfer_options_t, out *C.uintptr_t) (worker.Tier, worker.Tier, transfer.Options, C.kvbm_status_t) {
	if srcIDs == nil || dstIDs == nil || n == 0 || out == nil {
		return 0, 0, transfer.Options{}, fail(errInvalidArgument,
			"%s: src_ids, dst_ids and notification must not be NULL and num_blocks must not be 0", what)
	}
	st, ok1 := tier(src)
	dt, ok2 := tier(dst)
	if !ok1 || !ok2 {
		return 0, 0, transfer.Options{}, fail(errInvalidArgument, "%s: tiers %d -> %d: want KVBM_TIER_G1..G3", what, src, dst)
	}
	opts, status := transferOptions(what, o)
	return st, dt, opts, status
}

//export kvbmgo_worker_transfer
func kvbmgo_worker_transfer(h C.uintptr_t, src C.int32_t, srcIDs *C.uint32_t, dst C.int32_t, dstIDs *C.uint32_t,
	n C.size_t, o *C.kvbm_transfer_options_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	s, d, opts, st := transferArgs("worker_transfer", src, dst, srcIDs, dstIDs, n, o, out)
	if st != statusOK {
		return st
	}
	note, err := e.w.ExecuteLocalTransfer(s, d, blockIDs(srcIDs, n), blockIDs(dstIDs, n), opts)
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}

//export kvbmgo_worker_onboard_layerwise
func kvbmgo_worker_onboard_layerwise(h C.uintptr_t, srcIDs, dstIDs *C.uint32_t, n C.size_t,
	events *C.uintptr_t, numEvents C.size_t, stream C.uintptr_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	if srcIDs == nil || dstIDs == nil || n == 0 || events == nil || numEvents == 0 || out == nil {
		return fail(errInvalidArgument,
			"worker_onboard_layerwise: ids, events and notification must not be NULL, num_blocks and num_events not 0")
	}
	evs := make([]cuda.Event, int(numEvents))
	for i, v := range unsafe.Slice(events, int(numEvents)) {
		evs[i] = cuda.Event(v)
	}
	var sp *cuda.Stream
	if stream != 0 {
		sp = transfer.StreamOf(cuda.Stream(stream))
	}
	note, err := e.w.ExecuteLayerwiseOnboard(blockIDs(srcIDs, n), blockIDs(dstIDs, n), evs, sp)
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}

//export kvbmgo_worker_export_metadata
func kvbmgo_worker_export_metadata(h C.uintptr_t, buf *C.uint8_t, capacity C.size_t, size *C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	if size == nil || (buf == nil && capacity > 0) {
		return fail(errInvalidArgument, "worker_export_metadata: size is NULL, or buf is NULL with capacity %d", capacity)
	}
	md, err := e.w.ExportMetadata()
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
	if _, err := e.w.ImportMetadata(md); err != nil {
		return failErr(err)
	}
	return statusOK
}

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
	return result(e.w.ConnectRemote(worker.InstanceID(instance), [][]byte{md}))
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
	note, err := e.w.ExecuteRemoteOnboardForInstance(worker.InstanceID(instance), s, blockIDs(srcIDs, n), d,
		blockIDs(dstIDs, n), opts)
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}

// keysArg reads num_keys C keys.
func keysArg(what string, keys **C.uint8_t, lens *C.size_t, n C.size_t) ([]object.Key, C.kvbm_status_t) {
	if keys == nil || lens == nil || n == 0 {
		return nil, fail(errInvalidArgument, "%s: keys and key_lens must not be NULL and num_keys not 0", what)
	}
	ps := unsafe.Slice(keys, int(n))
	ls := unsafe.Slice(lens, int(n))
	out := make([]object.Key, len(ps))
	for i := range ps {
		if ps[i] == nil || ls[i] == 0 || ls[i] > C.KVBM_MAX_KEY_LEN {
			return nil, fail(errInvalidArgument, "%s: key %d is NULL or its length %d is not 1..%d", what, i, ls[i],
				C.KVBM_MAX_KEY_LEN)
		}
		k, err := object.NewKey(C.GoBytes(unsafe.Pointer(ps[i]), C.int(ls[i])))
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
	for i, p := range e.w.HasBlocks(context.Background(), ks) {
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
	ids *C.uint32_t) (*workerEntry, []object.Key, worker.Tier, C.kvbm_status_t) {
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

//export kvbmgo_worker_object_move
func kvbmgo_worker_object_move(h C.uintptr_t, put C.int, keys **C.uint8_t, lens *C.size_t, n C.size_t, t C.int32_t,
	ids *C.uint32_t, statuses *C.kvbm_status_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	what := "worker_object_get"
	if put != 0 {
		what = "worker_object_put"
	}
	e, ks, tr, st := objectArgs(what, h, keys, lens, n, t, ids)
	if st != statusOK {
		return st
	}
	var results []object.Result
	if put != 0 {
		results = e.w.PutBlocks(context.Background(), ks, tr, blockIDs(ids, n))
	} else {
		results = e.w.GetBlocks(context.Background(), ks, tr, blockIDs(ids, n))
	}
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
	if first != nil {
		return failErr(first)
	}
	return statusOK
}
