package main

/*
#include <stdlib.h>
#include <string.h>
#include "kvbm.h"
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/kvbm/kvbm/capi/internal/handles"
	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/node"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
)

// getWorker returns the worker (a node: the worker, its transport and its
// cache) that a kvbm_worker_t names.
func getWorker(h C.uintptr_t) (*node.Node, C.kvbm_status_t) {
	return lookup[*node.Node](h, kindWorker, "worker")
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

// tier checks a C tier value: a kvbm_tier_t, G1 to G3. G4 (object
// storage) has no layout; the object calls reach it, so 4 is refused like
// any other value that is not a kvbm_tier_t.
func tier(t C.int32_t) (worker.Tier, bool) {
	return worker.Tier(t), t >= C.KVBM_TIER_G1 && t <= C.KVBM_TIER_G3
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

// The sizes of kvbm_transfer_options_t's versions, so that callers built
// against an older one keep working: V1 before deadline_ms, V2 through
// it, and the head slice's fields read only when all seven are covered.
var (
	transferOptionsV1Size = C.size_t(unsafe.Offsetof(C.kvbm_transfer_options_t{}.deadline_ms))
	transferOptionsV2Size = transferOptionsV1Size + C.size_t(unsafe.Sizeof(C.uint32_t(0)))
	transferOptionsV3Size = C.size_t(unsafe.Offsetof(C.kvbm_transfer_options_t{}.dst_head_order) + unsafe.Sizeof(C.uint32_t(0)))
)

// transferOptions reads a kvbm_transfer_options_t (NULL: defaults).
func transferOptions(what string, o *C.kvbm_transfer_options_t) (transfer.Options, C.kvbm_status_t) {
	var opts transfer.Options
	if o == nil {
		return opts, statusOK
	}
	if o.struct_size < transferOptionsV1Size {
		return opts, fail(errInvalidArgument, "%s: options struct_size %d is less than %d (use KVBM_TRANSFER_OPTIONS_INIT)",
			what, o.struct_size, transferOptionsV1Size)
	}
	if o.struct_size >= transferOptionsV2Size {
		opts.Deadline = time.Duration(o.deadline_ms) * time.Millisecond
	}
	if o.struct_size >= transferOptionsV3Size && o.head_count > 0 {
		for _, order := range []C.uint32_t{o.src_head_order, o.dst_head_order} {
			if order != C.KVBM_HEADS_OUTER && order != C.KVBM_TOKENS_OUTER {
				return opts, fail(errInvalidArgument, "%s: head order %d is neither KVBM_HEADS_OUTER (1) nor KVBM_TOKENS_OUTER (2)",
					what, order)
			}
		}
		opts.Heads = &layout.HeadSlice{
			Src:      layout.Heads{Total: int(o.src_heads), Order: layout.HeadOrder(o.src_head_order)},
			Dst:      layout.Heads{Total: int(o.dst_heads), Order: layout.HeadOrder(o.dst_head_order)},
			SrcFirst: int(o.src_head_first), DstFirst: int(o.dst_head_first), Count: int(o.head_count),
		}
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
	if cfg.struct_size < workerConfigV1Size {
		return fail(errInvalidArgument, "worker_create: struct_size %d is less than %d (use KVBM_WORKER_CONFIG_INIT)",
			cfg.struct_size, workerConfigV1Size)
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
	var advertise string
	if cfg.struct_size >= workerConfigV2Size {
		sc.RemoteDeadline = time.Duration(cfg.remote_deadline_ms) * time.Millisecond
	}
	if cfg.struct_size >= workerConfigV3Size && cfg.advertise_host != nil {
		advertise = C.GoString(cfg.advertise_host)
	}
	if cfg.struct_size >= C.sizeof_kvbm_worker_config_t && cfg.g3_persist_id != nil {
		sc.G3PersistID = C.GoString(cfg.g3_persist_id)
	}
	n, err := node.New(node.Config{Worker: sc, Advertise: advertise})
	if err != nil {
		return failErr(fmt.Errorf("worker_create: %w", err))
	}
	*out = C.uintptr_t(table.Add(kindWorker, n))
	return statusOK
}

// workerConfigV1Size is kvbm_worker_config_t before remote_deadline_ms:
// callers built against it keep working.
var workerConfigV1Size = C.size_t(unsafe.Offsetof(C.kvbm_worker_config_t{}.remote_deadline_ms))

// workerConfigV2Size is kvbm_worker_config_t before advertise_host.
var workerConfigV2Size = C.size_t(unsafe.Offsetof(C.kvbm_worker_config_t{}.advertise_host))

// workerConfigV3Size is kvbm_worker_config_t before g3_persist_id.
var workerConfigV3Size = C.size_t(unsafe.Offsetof(C.kvbm_worker_config_t{}.g3_persist_id))

//export kvbmgo_worker_destroy
func kvbmgo_worker_destroy(h C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	v, ok := table.Remove(handles.Handle(h), kindWorker)
	if !ok {
		return badHandle("worker", h)
	}
	return result(v.(*node.Node).Close())
}

//export kvbmgo_worker_register_g1
func kvbmgo_worker_register_g1(h C.uintptr_t, c *C.kvbm_layout_config_t, ptrs *C.uint64_t, n C.size_t,
	out *C.kvbm_layout_handle_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	return registerExternal("worker_register_g1", h, c, ptrs, n, out, (*worker.PhysicalWorker).RegisterG1)
}

//export kvbmgo_worker_register_g1_host
func kvbmgo_worker_register_g1_host(h C.uintptr_t, c *C.kvbm_layout_config_t, ptrs *C.uint64_t, n C.size_t,
	out *C.kvbm_layout_handle_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	return registerExternal("worker_register_g1_host", h, c, ptrs, n, out, (*worker.PhysicalWorker).RegisterG1Host)
}

// maxReason bounds the reason kvbm_worker_unregister_g1 reads (it goes into
// every refusal's message).
const maxReason = 512

//export kvbmgo_worker_unregister_g1
func kvbmgo_worker_unregister_g1(h C.uintptr_t, reason *C.char) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	why := "the engine took its memory back (kvbm_worker_unregister_g1)"
	if reason != nil {
		why = C.GoStringN(reason, C.int(C.strnlen(reason, maxReason)))
	}
	return result(e.Worker().UnregisterG1(why))
}

//export kvbmgo_worker_register_g2
func kvbmgo_worker_register_g2(h C.uintptr_t, c *C.kvbm_layout_config_t, ptrs *C.uint64_t, n C.size_t,
	out *C.kvbm_layout_handle_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	return registerExternal("worker_register_g2", h, c, ptrs, n, out, (*worker.PhysicalWorker).RegisterG2)
}

// registerExternal serves the register calls: what names the call in
// messages.
func registerExternal(what string, h C.uintptr_t, c *C.kvbm_layout_config_t, ptrs *C.uint64_t, n C.size_t,
	out *C.kvbm_layout_handle_t,
	register func(*worker.PhysicalWorker, layout.Config, transfer.Shape, []uint64) (transfer.LayoutHandle, error)) C.kvbm_status_t {
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	if ptrs == nil || n == 0 {
		return fail(errInvalidArgument, "%s: ptrs is NULL or num_ptrs is 0", what)
	}
	cfg, shape, st := layoutConfig(what, c)
	if st != statusOK {
		return st
	}
	src := unsafe.Slice(ptrs, int(n))
	p := make([]uint64, len(src))
	for i, v := range src {
		p[i] = uint64(v)
	}
	lh, err := register(e.Worker(), cfg, shape, p)
	if err != nil {
		return failErr(err)
	}
	writeLayoutHandle(out, lh)
	return statusOK
}

//export kvbmgo_worker_allocate_g2
func kvbmgo_worker_allocate_g2(h C.uintptr_t, c *C.kvbm_layout_config_t, out *C.kvbm_layout_handle_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	return allocate("worker_allocate_g2", h, c, out, (*worker.PhysicalWorker).AllocateG2)
}

//export kvbmgo_worker_allocate_g3
func kvbmgo_worker_allocate_g3(h C.uintptr_t, c *C.kvbm_layout_config_t, out *C.kvbm_layout_handle_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	return allocate("worker_allocate_g3", h, c, out, (*worker.PhysicalWorker).AllocateG3)
}

// allocate serves the allocate calls: what names the call in messages.
func allocate(what string, h C.uintptr_t, c *C.kvbm_layout_config_t, out *C.kvbm_layout_handle_t,
	alloc func(*worker.PhysicalWorker, layout.Config, transfer.Shape) (transfer.LayoutHandle, error)) C.kvbm_status_t {
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	cfg, shape, st := layoutConfig(what, c)
	if st != statusOK {
		return st
	}
	lh, err := alloc(e.Worker(), cfg, shape)
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
	note, err := e.Worker().ExecuteLocalTransfer(s, d, blockIDs(srcIDs, n), blockIDs(dstIDs, n), opts)
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
	note, err := e.Worker().ExecuteLayerwiseOnboard(blockIDs(srcIDs, n), blockIDs(dstIDs, n), evs, sp)
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}
