package main

/*
#include "kvbm.h"
*/
import "C"

import (
	"sync"
	"unsafe"

	"github.com/kvbm/kvbm/capi/internal/handles"
	"github.com/kvbm/kvbm/core/handoff"
)

// handoffEntry is what a kvbm_handoff_t names. The coordinator is not safe
// for concurrent use; mu serialises C callers.
type handoffEntry struct {
	mu  sync.Mutex
	c   *handoff.Coordinator
	buf []handoff.Action
}

func getHandoff(h C.uintptr_t) (*handoffEntry, C.kvbm_status_t) {
	return lookup[*handoffEntry](h, kindHandoff, "handoff")
}

//export kvbmgo_handoff_new
func kvbmgo_handoff_new(id *C.uint8_t, order C.int32_t, fallbackDelayMs C.double, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if id == nil || out == nil {
		return fail(errInvalidArgument, "handoff_new: id and handoff must not be NULL")
	}
	if order < 0 || order > 255 {
		return fail(errInvalidArgument, "handoff_new: order %d out of range", order)
	}
	var hid handoff.HandoffID
	copy(hid[:], unsafe.Slice((*byte)(unsafe.Pointer(id)), len(hid)))
	c, err := handoff.NewCoordinator(hid, handoff.Order(order), float64(fallbackDelayMs))
	if err != nil {
		return failErr(err)
	}
	*out = C.uintptr_t(table.Add(kindHandoff, &handoffEntry{c: c, buf: make([]handoff.Action, 0, handoff.MaxActionsPerCall)}))
	return statusOK
}

// step checks the output array, runs fn under the entry's lock and writes
// the actions it returns.
func (e *handoffEntry) step(what string, actions *C.kvbm_handoff_action_t, capacity C.size_t, count *C.size_t,
	fn func(out []handoff.Action) ([]handoff.Action, error)) C.kvbm_status_t {
	if count == nil || actions == nil {
		return fail(errInvalidArgument, "%s: actions and count must not be NULL", what)
	}
	*count = 0
	if capacity < handoff.MaxActionsPerCall {
		return fail(errBufferTooSmall, "%s: room for %d actions, KVBM_HANDOFF_MAX_ACTIONS (%d) needed", what, capacity,
			handoff.MaxActionsPerCall)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	got, err := fn(e.buf[:0])
	if err != nil {
		return failErr(err)
	}
	out := unsafe.Slice(actions, int(capacity))
	for i, a := range got {
		out[i] = C.kvbm_handoff_action_t{
			id: C.uint64_t(a.ID), kind: C.int32_t(a.Kind), completion: C.int32_t(a.Completion),
			delay_ms: C.double(a.DelayMs),
		}
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&out[i].handoff_id[0])), 16), a.Handoff[:])
	}
	*count = C.size_t(len(got))
	return statusOK
}

//export kvbmgo_handoff_start
func kvbmgo_handoff_start(h C.uintptr_t, actions *C.kvbm_handoff_action_t, capacity C.size_t, count *C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getHandoff(h)
	if st != statusOK {
		return st
	}
	return e.step("handoff_start", actions, capacity, count, func(out []handoff.Action) ([]handoff.Action, error) {
		return e.c.Start(out), nil
	})
}

//export kvbmgo_handoff_on_fact
func kvbmgo_handoff_on_fact(h C.uintptr_t, f *C.kvbm_handoff_fact_t, actions *C.kvbm_handoff_action_t, capacity C.size_t,
	count *C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getHandoff(h)
	if st != statusOK {
		return st
	}
	if f == nil {
		return fail(errInvalidArgument, "handoff_on_fact: fact is NULL")
	}
	if f.struct_size < C.sizeof_kvbm_handoff_fact_t {
		return fail(errInvalidArgument, "handoff_on_fact: struct_size %d is less than %d (use KVBM_HANDOFF_FACT_INIT)",
			f.struct_size, C.sizeof_kvbm_handoff_fact_t)
	}
	if f.kind < 0 || f.kind > 255 || f.timing_mode < 0 || f.timing_mode > 255 {
		return fail(errInvalidArgument, "handoff_on_fact: kind %d or timing_mode %d out of range", f.kind, f.timing_mode)
	}
	fact := handoff.Fact{
		Kind: handoff.FactKind(f.kind),
		Timing: handoff.TransferTiming{
			Mode:               handoff.TimingMode(f.timing_mode),
			FullPromptTokens:   uint64(f.full_prompt_tokens),
			KVBytesPerToken:    uint64(f.kv_bytes_per_token),
			HasKVBytesPerToken: f.has_kv_bytes_per_token != 0,
			BandwidthGBs:       float64(f.bandwidth_gbs),
			HasBandwidthGBs:    f.has_bandwidth_gbs != 0,
		},
		TransferableTokens: uint64(f.transferable_tokens),
	}
	copy(fact.Handoff[:], unsafe.Slice((*byte)(unsafe.Pointer(&f.handoff_id[0])), 16))
	return e.step("handoff_on_fact", actions, capacity, count, func(out []handoff.Action) ([]handoff.Action, error) {
		return e.c.Step(fact, out)
	})
}

//export kvbmgo_handoff_on_outcome
func kvbmgo_handoff_on_outcome(h C.uintptr_t, id C.uint64_t, kind C.int32_t, msg *C.char, actions *C.kvbm_handoff_action_t,
	capacity C.size_t, count *C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getHandoff(h)
	if st != statusOK {
		return st
	}
	if kind < 0 || kind > 255 {
		return fail(errInvalidArgument, "handoff_on_outcome: outcome %d out of range", kind)
	}
	o := handoff.Outcome{Kind: handoff.OutcomeKind(kind)}
	if msg != nil {
		o.Message = C.GoString(msg)
	}
	return e.step("handoff_on_outcome", actions, capacity, count, func(out []handoff.Action) ([]handoff.Action, error) {
		return e.c.Outcome(handoff.ActionID(id), o, out)
	})
}

//export kvbmgo_handoff_is_complete
func kvbmgo_handoff_is_complete(h C.uintptr_t, out *C.int32_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getHandoff(h)
	if st != statusOK {
		return st
	}
	if out == nil {
		return fail(errInvalidArgument, "handoff_is_complete: complete is NULL")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	*out = 0
	if e.c.IsComplete() {
		*out = 1
	}
	return statusOK
}

//export kvbmgo_handoff_completion
func kvbmgo_handoff_completion(h C.uintptr_t, out *C.int32_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getHandoff(h)
	if st != statusOK {
		return st
	}
	if out == nil {
		return fail(errInvalidArgument, "handoff_completion: completion is NULL")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	*out = C.int32_t(e.c.Completion())
	return statusOK
}

//export kvbmgo_handoff_free
func kvbmgo_handoff_free(h C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if _, ok := table.Remove(handles.Handle(h), kindHandoff); !ok {
		return badHandle("handoff", h)
	}
	return statusOK
}
