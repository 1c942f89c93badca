package main

/*
#include "kvbm.h"
#include <string.h>
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/kvbm/kvbm/core/cache"
	"github.com/kvbm/kvbm/core/loadplan"
	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
)

// getCache returns a worker's cache, or the status of a worker without one.
func getCache(what string, h C.uintptr_t) (*cache.Cache, C.kvbm_status_t) {
	e, st := getWorker(h)
	if st != statusOK {
		return nil, st
	}
	c := e.Cache()
	if c == nil {
		return nil, fail(errFailedPrecondition, "%s: the worker has no cache; call kvbm_worker_cache_enable first", what)
	}
	return c, statusOK
}

func writeModeArg(what string, v C.int32_t) (cache.WriteMode, C.kvbm_status_t) {
	if v < C.KVBM_WRITE_AUTO || v > C.KVBM_WRITE_THROUGH {
		return 0, fail(errInvalidArgument, "worker_cache_enable: %s %d is not a kvbm_write_mode_t (0 to 3)", what, v)
	}
	return cache.WriteMode(v), statusOK
}

//export kvbmgo_worker_cache_enable
func kvbmgo_worker_cache_enable(h C.uintptr_t, cfg *C.kvbm_cache_config_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	e, st := getWorker(h)
	if st != statusOK {
		return st
	}
	var cc cache.Config
	if cfg != nil {
		if cfg.struct_size < C.sizeof_kvbm_cache_config_t {
			return fail(errInvalidArgument, "worker_cache_enable: struct_size %d is less than %d (use KVBM_CACHE_CONFIG_INIT)",
				cfg.struct_size, C.sizeof_kvbm_cache_config_t)
		}
		if cc.G3, st = writeModeArg("g3_mode", cfg.g3_mode); st != statusOK {
			return st
		}
		if cc.G4, st = writeModeArg("g4_mode", cfg.g4_mode); st != statusOK {
			return st
		}
		cc.AdmitAfter, cc.MaxEvents = int(cfg.admit_after), int(cfg.max_events)
	}
	if _, err := e.EnableCache(cc); err != nil {
		return failErr(fmt.Errorf("worker_cache_enable: %w", err))
	}
	return statusOK
}

//export kvbmgo_worker_cache_match
func kvbmgo_worker_cache_match(h C.uintptr_t, keys **C.uint8_t, lens *C.size_t, n C.size_t, matched *C.size_t,
	tiers *C.int32_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	c, st := getCache("worker_cache_match", h)
	if st != statusOK {
		return st
	}
	raw, st := rawKeysArg("worker_cache_match", keys, lens, n)
	if st != statusOK {
		return st
	}
	if matched == nil {
		return fail(errInvalidArgument, "worker_cache_match: matched is NULL")
	}
	m, ts, err := c.Match(raw)
	if err != nil {
		return failErr(err)
	}
	*matched = C.size_t(m)
	if tiers != nil {
		out := unsafe.Slice(tiers, int(n))
		for i := range out {
			out[i] = 0
			if i < len(ts) {
				out[i] = C.int32_t(ts[i])
			}
		}
	}
	return statusOK
}

//export kvbmgo_worker_cache_offload
func kvbmgo_worker_cache_offload(h C.uintptr_t, keys **C.uint8_t, lens *C.size_t, n C.size_t, g1 *C.uint32_t,
	precondition C.uintptr_t, decisions *C.int32_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	c, st := getCache("worker_cache_offload", h)
	if st != statusOK {
		return st
	}
	raw, st := rawKeysArg("worker_cache_offload", keys, lens, n)
	if st != statusOK {
		return st
	}
	if g1 == nil || out == nil {
		return fail(errInvalidArgument, "worker_cache_offload: g1_ids and notification must not be NULL")
	}
	note, ds, err := c.Offload(raw, blockIDs(g1, n), cuda.Event(precondition))
	if err != nil {
		return failErr(err)
	}
	if decisions != nil {
		out := unsafe.Slice(decisions, int(n))
		for i, d := range ds {
			out[i] = C.int32_t(d)
		}
	}
	return addNotification(note, out)
}

//export kvbmgo_worker_cache_onboard
func kvbmgo_worker_cache_onboard(h C.uintptr_t, keys **C.uint8_t, lens *C.size_t, n C.size_t, g1 *C.uint32_t,
	events *C.uintptr_t, numEvents C.size_t, stream C.uintptr_t, out *C.uintptr_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	c, st := getCache("worker_cache_onboard", h)
	if st != statusOK {
		return st
	}
	raw, st := rawKeysArg("worker_cache_onboard", keys, lens, n)
	if st != statusOK {
		return st
	}
	if g1 == nil || out == nil || (events == nil) != (numEvents == 0) {
		return fail(errInvalidArgument,
			"worker_cache_onboard: g1_ids and notification must not be NULL, and layer_events NULL exactly when num_events is 0")
	}
	var evs []cuda.Event
	for _, v := range unsafe.Slice(events, int(numEvents)) {
		evs = append(evs, cuda.Event(v))
	}
	var sp *cuda.Stream
	if stream != 0 {
		sp = transfer.StreamOf(cuda.Stream(stream))
	}
	note, err := c.Onboard(raw, blockIDs(g1, n), evs, sp)
	if err != nil {
		return failErr(err)
	}
	return addNotification(note, out)
}

func tierStats(s pool.Stats) C.kvbm_cache_tier_stats_t {
	return C.kvbm_cache_tier_stats_t{
		capacity: C.uint64_t(s.Capacity), free: C.uint64_t(s.Free), registered: C.uint64_t(s.Registered),
		pinned: C.uint64_t(s.Pinned), in_flight: C.uint64_t(s.Allocated + s.Storing),
		hits: C.uint64_t(s.Hits), misses: C.uint64_t(s.Misses), evictions: C.uint64_t(s.Evictions),
		stored: C.uint64_t(s.Stored), removed: C.uint64_t(s.Removed),
	}
}

//export kvbmgo_worker_cache_stats
func kvbmgo_worker_cache_stats(h C.uintptr_t, out *C.kvbm_cache_stats_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	c, st := getCache("worker_cache_stats", h)
	if st != statusOK {
		return st
	}
	if out == nil || out.struct_size < cacheStatsV1Size {
		return fail(errInvalidArgument, "worker_cache_stats: stats is NULL or its struct_size is less than %d (use KVBM_CACHE_STATS_INIT)",
			cacheStatsV1Size)
	}
	s := c.Stats()
	u := func(v uint64) C.uint64_t { return C.uint64_t(v) }
	full := C.kvbm_cache_stats_t{
		struct_size: out.struct_size,
		g2:          tierStats(s.G2), g3: tierStats(s.G3),
		g4_known: u(uint64(s.G4Known)), g4_hits: u(s.G4Hits), g4_misses: u(s.G4Misses), g4_puts: u(s.G4Puts),
		g4_put_failures: u(s.G4PutFailures), g4_corrupt: u(s.G4Corrupt),
		offloaded: u(s.Offloaded), deduped: u(s.Deduped), not_admitted: u(s.NotAdmitted), no_space: u(s.NoSpace),
		offload_failed: u(s.OffloadFailed), onboarded: u(s.Onboarded), onboarded_from_g2: u(s.OnboardedFromG2),
		onboarded_from_g3: u(s.OnboardedFromG3), onboarded_from_g4: u(s.OnboardedFromG4), onboard_failed: u(s.OnboardFailed),
		written_down: u(s.WrittenDown), write_down_failed: u(s.WriteDownFailed), events_dropped: u(s.EventsDropped),
	}
	if out.struct_size < C.sizeof_kvbm_cache_stats_t {
		// A caller built before g3_restored: its struct ends there.
		C.memcpy(unsafe.Pointer(out), unsafe.Pointer(&full), cacheStatsV1Size)
		return statusOK
	}
	full.g3_restored, full.g3_refused = u(s.G3Restored), u(s.G3Refused)
	for t := range 5 {
		full.load_rate[t], full.load_queued[t] = C.double(s.LoadRate[t]), C.double(s.LoadQueued[t])
	}
	*out = full
	return statusOK
}

// cacheStatsV1Size is kvbm_cache_stats_t before g3_restored.
var cacheStatsV1Size = C.size_t(unsafe.Offsetof(C.kvbm_cache_stats_t{}.g3_restored))

//export kvbmgo_worker_cache_events
func kvbmgo_worker_cache_events(h C.uintptr_t, events *C.kvbm_cache_event_t, capacity C.size_t, count *C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	c, st := getCache("worker_cache_events", h)
	if st != statusOK {
		return st
	}
	if events == nil || capacity == 0 || count == nil {
		return fail(errInvalidArgument, "worker_cache_events: events and count must not be NULL and capacity not 0")
	}
	got := c.DrainEvents(nil, int(capacity))
	out := unsafe.Slice(events, int(capacity))
	for i, ev := range got {
		k := ev.Key.Bytes()
		out[i].kind = C.int32_t(C.KVBM_CACHE_EVENT_STORED)
		if ev.Kind == pool.Removed {
			out[i].kind = C.KVBM_CACHE_EVENT_REMOVED
		}
		out[i].tier = C.int32_t(ev.Tier)
		out[i].key_len = C.uint32_t(len(k))
		dst := unsafe.Slice((*byte)(unsafe.Pointer(&out[i].key[0])), len(out[i].key))
		clear(dst)
		copy(dst, k)
	}
	*count = C.size_t(len(got))
	return statusOK
}

//export kvbmgo_worker_cache_reset
func kvbmgo_worker_cache_reset(h C.uintptr_t, g2, g3 *C.uint64_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	c, st := getCache("worker_cache_reset", h)
	if st != statusOK {
		return st
	}
	n2, n3, err := c.Reset()
	if err != nil {
		return failErr(err)
	}
	if g2 != nil {
		*g2 = C.uint64_t(n2)
	}
	if g3 != nil {
		*g3 = C.uint64_t(n3)
	}
	return statusOK
}

//export kvbmgo_load_plan
func kvbmgo_load_plan(tiers *C.int32_t, n C.size_t, in *C.kvbm_load_plan_input_t, out *C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if in == nil || out == nil || (tiers == nil && n > 0) {
		return fail(errInvalidArgument, "load_plan: input and blocks must not be NULL, nor tiers when num_blocks > 0")
	}
	if in.struct_size < C.sizeof_kvbm_load_plan_input_t {
		return fail(errInvalidArgument, "load_plan: struct_size %d is less than %d (use KVBM_LOAD_PLAN_INPUT_INIT)",
			in.struct_size, C.sizeof_kvbm_load_plan_input_t)
	}
	p := loadplan.Input{BlockBytes: float64(in.block_bytes), TokensPerBlock: int(in.tokens_per_block),
		PrefillRate: float64(in.prefill_tokens_per_s), Margin: float64(in.margin)}
	if n > 0 {
		for _, t := range unsafe.Slice((*int32)(unsafe.Pointer(tiers)), int(n)) {
			p.Tiers = append(p.Tiers, int(t))
		}
	}
	for t := range 5 {
		p.Load[t] = loadplan.Tier{Rate: float64(in.load_rate[t]), Queued: float64(in.load_queued[t])}
	}
	d, err := loadplan.Plan(p)
	if err != nil {
		return failErr(err)
	}
	*out = C.size_t(d.Blocks)
	return statusOK
}
