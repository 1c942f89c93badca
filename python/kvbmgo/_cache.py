"""A worker's prefix cache: which G2/G3/G4 blocks hold which KV, by key.

The policy (which blocks, eviction, dedupe, write-down, staging) is the
library's; this module only translates calls. Keys are the engine's block
keys: ``bytes`` (vLLM's block hashes) or ``str`` (SGLang's hex page keys,
UTF-8 encoded), 1 to 64 bytes each.
"""

from __future__ import annotations

import enum
from ctypes import byref, c_int32, c_size_t, c_uint64, c_void_p, sizeof
from dataclasses import dataclass, fields
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _lib
from ._cint import block_ids, keys as _keys, uint32
from ._device import Event, Stream, pointer_of
from ._handle import Handle
from ._layout import Tier
from ._lib import lib
from ._notification import Notification

__all__ = ["PrefixCache", "WriteMode", "Decision", "CacheEvent", "CacheEventKind", "CacheStats",
           "CacheTierStats"]

Key = Union[bytes, bytearray, memoryview, str]


class WriteMode(enum.IntEnum):
    """When blocks are written down to G3 or G4 (kvbm_write_mode_t)."""
    AUTO = 0           #: G3: write-back when there is G3; G4: write-back when there is a store
    OFF = 1            #: never
    WRITE_BACK = 2     #: when evicted from the tier above
    WRITE_THROUGH = 3  #: as soon as the block lands in G2


class Decision(enum.IntEnum):
    """What an offload decided for one key."""
    STORE = 0         #: copied to a G2 block
    PRESENT = 1       #: cached already: nothing copied
    IN_FLIGHT = 2     #: being stored already: nothing copied
    NOT_ADMITTED = 3  #: not offered admit_after times yet
    NO_SPACE = 4      #: every G2 block is held by a transfer


class CacheEventKind(enum.IntEnum):
    STORED = 1   #: the key became present in the tier
    REMOVED = 2  #: it left the tier (evicted, or found corrupt)


@dataclass(frozen=True)
class CacheEvent:
    """A key entering or leaving a tier (tier 4 is G4, the object store)."""
    kind: CacheEventKind
    tier: int
    key: bytes


@dataclass(frozen=True)
class CacheTierStats:
    capacity: int
    free: int
    registered: int
    pinned: int
    in_flight: int
    hits: int
    misses: int
    evictions: int
    stored: int
    removed: int


@dataclass(frozen=True)
class CacheStats:
    g2: CacheTierStats
    g3: CacheTierStats
    g4_known: int
    g4_hits: int
    g4_misses: int
    g4_puts: int
    g4_put_failures: int
    g4_corrupt: int
    offloaded: int
    deduped: int
    not_admitted: int
    no_space: int
    offload_failed: int
    onboarded: int
    onboarded_from_g2: int
    onboarded_from_g3: int
    onboarded_from_g4: int
    onboard_failed: int
    written_down: int
    write_down_failed: int
    events_dropped: int
    #: A persistent G3's blocks vouched for at start, and refused.
    g3_restored: int = 0
    g3_refused: int = 0
    #: Bytes per second each tier's loads ran at lately, by tier number
    #: (indices 2, 3, 4; 0 until measured), and bytes in flight (load_plan).
    load_rate: Tuple[float, ...] = (0.0,) * 5
    load_queued: Tuple[float, ...] = (0.0,) * 5


def _mode(value: Any, what: str) -> int:
    if isinstance(value, str):
        try:
            return WriteMode[value.upper().replace("-", "_")]
        except KeyError:
            raise ValueError(f"{what}: {value!r} is not one of "
                             f"{[m.name.lower() for m in WriteMode]}") from None
    return WriteMode(value)  # ValueError for an int that is no mode


class PrefixCache:
    """The prefix cache of a Worker (``Worker.enable_cache``); it lives and
    closes with its worker. Safe to use from many threads at once."""

    __slots__ = ("_worker",)

    def __init__(self, worker: Handle) -> None:  # its Worker
        self._worker = worker

    def match(self, keys: Sequence[Key]) -> Tuple[int, List[Tier]]:
        """How many leading keys can be onboarded now, and the tier each
        would come from (G2, G3, or 4 for G4). Changes nothing later calls
        depend on: a scheduler may ask again. Raises InvalidArgumentError (a
        bad or repeated key)."""
        k, lens, n = _keys(keys)
        if n == 0:
            return 0, []
        matched = c_size_t()
        tiers = (c_int32 * n)()
        lib.kvbm_worker_cache_match(self._worker.handle, k, lens, n, byref(matched), tiers)
        m = matched.value
        return m, [Tier(t) if t in (1, 2, 3) else t for t in tiers[:m]]

    def offload(self, keys: Sequence[Key], g1_ids: Any, *,
                precondition: "Union[Event, int, None]" = None
                ) -> Tuple[Notification, List[Decision]]:
        """Saves G1 block g1_ids[i], holding the KV of keys[i], to G2 after
        precondition (the engine's compute event) unless the key is cached
        or in flight already, not admitted yet, or no block is free; the
        decisions say which. The Notification completes when the G1 blocks
        may be reused; it fails naming the G1 blocks not saved. Raises
        ValueError (lengths differ), InvalidArgumentError (a bad or repeated
        key, an id that does not fit a uint32), OutOfRangeError (a G1 id
        beyond G1), TypeError (an id that is not an integer, or a
        precondition that is neither an Event, an int nor None),
        CanceledError (the worker is closing); nothing changed on an error."""
        k, lens, n = _keys(keys)
        b, ba, m = block_ids(g1_ids, "g1_ids")
        if m != n:
            raise ValueError(f"{n} keys for {m} G1 block ids: they must be as long")
        decisions = (c_int32 * max(n, 1))()
        out = c_void_p()
        lib.kvbm_worker_cache_offload(self._worker.handle, k, lens, n, ba,
                                      pointer_of(precondition, Event, "precondition"), decisions,
                                      byref(out))
        return Notification(out.value), [Decision(d) for d in decisions[:n]]

    def onboard(self, keys: Sequence[Key], g1_ids: Any, *,
                layer_events: "Optional[Sequence[Union[Event, int]]]" = None,
                stream: "Union[Stream, int, None]" = None) -> Notification:
        """Loads keys[i] into G1 block g1_ids[i] from the tier that caches it.
        The Notification fails naming the G1 blocks not loaded (a key no
        longer cached, a corrupt block, a failed copy); the others are
        loaded. With layer_events (one per layer) the copies go layer by
        layer on stream and every event is recorded before this returns.
        Raises ValueError (lengths differ), InvalidArgumentError (a bad or
        repeated key, a repeated G1 id, the number of events, an id that does
        not fit a uint32),
        OutOfRangeError (a G1 id beyond G1), TypeError, CanceledError (the
        worker is closing); nothing changed on an error."""
        k, lens, n = _keys(keys)
        b, ba, m = block_ids(g1_ids, "g1_ids")
        if m != n:
            raise ValueError(f"{n} keys for {m} G1 block ids: they must be as long")
        ev, ne = None, 0
        if layer_events is not None:
            ne = len(layer_events)
            ev = (c_void_p * ne)(*(pointer_of(e, Event, "layer_events") for e in layer_events))
        out = c_void_p()
        lib.kvbm_worker_cache_onboard(self._worker.handle, k, lens, n, ba, ev, ne,
                                      pointer_of(stream, Stream, "stream"), byref(out))
        return Notification(out.value)

    def stats(self) -> CacheStats:
        """Occupancy of G2 and G3 and the cache's counters."""
        c = _lib.CacheStatsC()
        c.struct_size = sizeof(c)
        lib.kvbm_worker_cache_stats(self._worker.handle, byref(c))

        def tier(t: Any) -> CacheTierStats:
            return CacheTierStats(*(getattr(t, f.name) for f in fields(CacheTierStats)))
        rest = [getattr(c, f.name) for f in fields(CacheStats)[2:]]
        rest = [tuple(v) if f.name.startswith("load_") else v
                for f, v in zip(fields(CacheStats)[2:], rest)]
        return CacheStats(tier(c.g2), tier(c.g3), *rest)

    def reset(self) -> Tuple[int, int]:
        """Forgets every key G2 and G3 hold (a REMOVED event for each; keys
        still being stored land afterwards; G4 objects are kept). Returns
        how many keys left (G2, G3). Raises FailedPreconditionError (no
        cache), CanceledError (the worker is closing)."""
        g2, g3 = c_uint64(), c_uint64()
        lib.kvbm_worker_cache_reset(self._worker.handle, byref(g2), byref(g3))
        return g2.value, g3.value

    def events(self, max_events: Optional[int] = None) -> List[CacheEvent]:
        """Drains the events (all, or the oldest max_events): keys that
        entered or left a tier, in order, for KV-aware routers."""
        out: List[CacheEvent] = []
        batch = 256
        while max_events is None or len(out) < max_events:
            want = batch if max_events is None else min(batch, max_events - len(out))
            buf = (_lib.CacheEventC * want)()
            count = c_size_t()
            lib.kvbm_worker_cache_events(self._worker.handle, buf, want, byref(count))
            for e in buf[:count.value]:
                out.append(CacheEvent(CacheEventKind(e.kind), e.tier, bytes(e.key[:e.key_len])))
            if count.value < want:
                break
        return out


def enable(worker: Handle, admit_after: int, g3: Any, g4: Any, max_events: int) -> PrefixCache:
    c = _lib.CacheConfigC()
    c.struct_size = sizeof(c)
    c.admit_after = uint32(admit_after, "admit_after")
    c.g3_mode = _mode(g3, "g3")
    c.g4_mode = _mode(g4, "g4")
    c.max_events = uint32(max_events, "max_events")
    lib.kvbm_worker_cache_enable(worker.handle, byref(c))
    return PrefixCache(worker)
