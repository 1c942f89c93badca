"""HiCache storage v2: the host pools of hybrid models (Mamba states,
sliding-window KV, draft and sidecar pools) beside the KV pool.

SGLang's HybridCacheController keeps moving the KV pool's pages through
``batch_*_v1`` (KvbmHiCacheStorage, unchanged) and hands the other pools to
the v2 calls:

=====================================  ======================================
SGLang                                 kvbm
=====================================  ======================================
register_mem_host_pool_v2(pool, name)  a PoolStore: one worker per part of
                                       the pool (host_pool.pool_layout), its
                                       G1 the pool's own buffers (no copies)
batch_exists_v2(keys, transfers)       the KV pool's leading run, cut by each
                                       transfer's hit policy
batch_set_v2 / batch_get_v2            per transfer, one offload / onboard
                                       per part (chunked by G2)
=====================================  ======================================

A pool's pages live under keys of their own (the pool's name, part and
shape hashed with the rank's namespace), so a Mamba state and the KV page
that end at the same token never share a key. A pool kvbm cannot keep
(no layout, a registration kvbm refuses) is declared unavailable with one
warning naming it: its pages are reported missing (a hit of 0 for it, no
prefix that needs it restorable) and its moves False.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional, Sequence, Set

from .._worker import Worker
from .cache_moves import load_blocks, save_blocks
from .host_pool import PoolLayout, pool_layout

__all__ = ["HiCacheV2", "PoolStore", "page_ids"]

logger = logging.getLogger("kvbmgo.sglang.hicache")

#: G2 pages of a pool other than KV when its settings name none: a state
#: can be megabytes, and a node backs up one (Mamba) or a window (SWA).
_POOL_G2_PAGES = 32

_KV = "kv"


def pool_name(name: Any) -> str:
    """SGLang's pool name as a plain string (PoolName is a str Enum whose
    hash is not its value's)."""
    return str(name.value if isinstance(name, Enum) else name)


def page_ids(n: int, host_indices: Any, page_size: int, num_pages: int) -> List[Optional[int]]:
    """The pool page of each of n keys: host_indices[i * page_size] (slots) /
    page_size; None when key i has no whole, aligned page of slots (then
    that key fails)."""
    if host_indices is None:
        return [None] * n
    idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
    out: List[Optional[int]] = []
    for i in range(n):
        run = idx[i * page_size:(i + 1) * page_size]
        first = run[0] if run else -1
        if (len(run) != page_size or first < 0 or first % page_size or
                first // page_size >= num_pages or run[-1] != first + page_size - 1):
            out.append(None)
        else:
            out.append(first // page_size)
    return out


@dataclass
class _Part:
    """One kvbm worker holding one part of a pool's pages. tag None: the
    KV pool's v1 worker, whose keys are v1's."""
    worker: Worker
    g2_pages: int
    tag: Optional[bytes]
    owned: bool


@dataclass
class PoolStore:
    """One registered host pool in kvbm."""
    name: str
    layout: PoolLayout
    parts: List[_Part]
    # get_stats: per batch, pages moved and GB/s, since the last call
    moved: Dict[str, List[float]] = field(default_factory=lambda: _no_moves())

    def keys(self, part: _Part, namespace: bytes, keys: Sequence[Any]) -> List[bytes]:
        prefix = namespace if part.tag is None else namespace + part.tag
        return [hashlib.sha256(prefix + (k.encode() if isinstance(k, str) else bytes(k))).digest()
                for k in keys]

    def save(self, namespace: bytes, keys: List[Any], pages: List[int]) -> List[bool]:
        """True per page every part stored (or had)."""
        ok = [True] * len(keys)
        for part in self.parts:
            res = save_blocks(part.worker.cache, part.g2_pages, self.keys(part, namespace, keys),
                              pages, f"{self.name} pages")
            ok = [a and b for a, b in zip(ok, res)]
        return ok

    def load(self, namespace: bytes, keys: List[Any], pages: List[int]) -> List[bool]:
        """True per page every part loaded: a page some part failed is
        False, whatever the others wrote into it."""
        ok = [True] * len(keys)
        for part in self.parts:
            res = load_blocks(part.worker.cache, part.g2_pages, self.keys(part, namespace, keys),
                              pages, f"{self.name} pages")
            ok = [a and b for a, b in zip(ok, res)]
        return ok

    def present(self, namespace: bytes, keys: List[Any]) -> List[bool]:
        """Per key: every part can load it now (a state pool holds scattered
        pages, so each key is asked on its own)."""
        have = [True] * len(keys)
        for part in self.parts:
            cache = part.worker.cache
            for i, k in enumerate(self.keys(part, namespace, keys)):
                if have[i]:
                    have[i] = cache.match([k])[0] == 1
        return have

    def leading(self, namespace: bytes, keys: List[Any]) -> int:
        """How many leading keys every part can load now."""
        n = len(keys)
        for part in self.parts:
            kb = self.keys(part, namespace, keys[:n])
            seen: Set[bytes] = set()
            for i, k in enumerate(kb):  # kvbm is asked a key once
                if k in seen:
                    kb = kb[:i]
                    break
                seen.add(k)
            n = min(n, part.worker.cache.match(kb)[0] if kb else 0)
        return n

    def close(self) -> None:
        for part in self.parts:
            if part.owned:
                part.worker.close()

    def reset(self) -> None:
        for part in self.parts:
            if part.owned:
                part.worker.cache.reset()


def _no_moves() -> Dict[str, List[float]]:
    return {k: [] for k in ("prefetch_pgs", "prefetch_bandwidth", "backup_pgs",
                            "backup_bandwidth")}


class HiCacheV2:
    """The v2 calls of KvbmHiCacheStorage (a mixin: it uses the backend's
    config, namespace, worker ids and v1 KV worker)."""

    def _v2_init(self) -> None:
        self._pools: Dict[str, PoolStore] = {}
        self._unavailable: Dict[str, str] = {}
        self._pools_lock = threading.Lock()
        self._pool_workers = 0  # made so far, for ids from an explicit worker_id

    # ---- registration

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Makes host_pool (SGLang's pool host_pool_name) a kvbm store of its
        own. A pool kvbm cannot keep is declared unavailable (one warning);
        this never raises for it, so SGLang's attach goes on with the rest."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)  # SGLang's bookkeeping
        name = pool_name(host_pool_name)
        with self._pools_lock:
            old = self._pools.pop(name, None)
            self._unavailable.pop(name, None)
        if old is not None:
            old.close()
        if name == _KV and host_pool is self.mem_pool_host and self._staging is not None:
            # The copying path (interface_v1 0): KV pages move through the
            # copying calls; SGLang hands v2 no KV transfer.
            return
        try:
            store = self._make_pool_store(name, host_pool)
        except Exception as e:  # noqa: BLE001 - whatever the cause, the pool is not kept
            self._declare_unavailable(name, f"{type(host_pool).__name__}: {e}")
            return
        with self._pools_lock:
            self._pools[name] = store
        logger.info("kvbm HiCache storage: host pool %r: %d pages of %d bytes in %d part(s) "
                    "(%s)", name, store.layout.num_pages, store.layout.page_bytes,
                    len(store.parts), store.layout.signature)

    def on_host_pools_registered(self) -> None:
        """The pool set is known: one line saying what kvbm keeps."""
        if self._pools or self._unavailable:
            logger.info("kvbm HiCache storage: host pools kept: %s; unavailable: %s",
                        sorted(self._pools) or "none", sorted(self._unavailable) or "none")

    def _declare_unavailable(self, name: str, reason: str) -> None:
        with self._pools_lock:
            if name in self._unavailable:
                return
            self._unavailable[name] = reason
        logger.warning("kvbm HiCache storage: host pool %r is unavailable (%s): its pages are "
                       "reported missing, so no prefix that needs them is restorable", name,
                       reason)

    def _make_pool_store(self, name: str, pool: Any) -> PoolStore:
        if name == _KV and pool is self.mem_pool_host:
            # The anchor: v1 registered it already; v2 moves go through the
            # same worker under the same keys.
            if self._worker is None:
                raise RuntimeError("registered before register_mem_pool_host")
            layout = pool_layout(pool)
            return PoolStore(name, layout, [_Part(self._worker, self._g2_pages, None, False)])
        layout = pool_layout(pool)
        c = self.config
        settings = dict((c.pools or {}).get(name, {}))
        g2 = settings.get("g2_pages", min(_POOL_G2_PAGES, layout.num_pages))
        g3 = settings.get("g3_pages", c.g3_pages)
        sc = self.storage_config
        # Every pool but KV is per rank, MLA or not (Mamba states are
        # tensor-sharded), so the tensor rank is in its tag.
        rank = int(getattr(sc, "tp_rank", 0) or 0)
        parts: List[_Part] = []
        try:
            for i, p in enumerate(layout.parts):
                self._pool_workers += 1
                # An explicit worker_id is the KV pool's; the others' follow it.
                wid = (c.worker_id + (self._pool_workers << 40) if c.worker_id
                       else self._next_worker_id())
                w = Worker(wid, device_id=c.device_id, rank=rank,
                           disk_dir=c.disk_dir or None, object_dir=c.object_dir or None)
                parts.append(_Part(w, g2, f"|v2|pool={name}|part={i}|{layout.signature}|"
                                      f"tp={rank}|".encode(), True))
                w.register_g1_host(p.config, list(p.regions))
                w.allocate_g2(p.config.replace(num_blocks=g2, layout="fully_contiguous",
                                               block_dim="first"))
                if c.disk_dir:
                    os.makedirs(c.disk_dir, mode=0o700, exist_ok=True)
                    w.allocate_g3(p.config.replace(num_blocks=g3, layout="fully_contiguous",
                                                   block_dim="first"))
                w.enable_cache(g3=c.g3_mode, g4=c.g4_mode)
        except BaseException:
            for part in parts:
                part.worker.close()
            raise
        return PoolStore(name, layout, parts)

    def _store(self, name: str) -> Optional[PoolStore]:
        store = self._pools.get(name)
        if store is None and name not in self._unavailable:
            self._declare_unavailable(name, "never registered")
        return store

    # ---- queries

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[Any]] = None,
                        extra_info: Any = None) -> Any:
        """The usable prefix of keys (KV page hashes): the KV pool's leading
        run as far as it is worth loading (batch_exists: the load policy),
        cut by each pool's policy. ALL_PAGES: the pool's leading run.
        TRAILING_PAGES (a state covering the last len(transfer.keys) pages):
        a prefix of p pages is restorable when the pool has pages p-n..p-1,
        so prefixes are scattered. BLOCK_GROUPS: the pages the pool's
        leading whole groups cover, its own verdict, no cut.
        restorable_prefix_pages lists every restorable length of this rank."""
        from sglang.srt.mem_cache.hicache_storage import (PoolHitPolicy, PoolName,
                                                          PoolTransferResult)
        if not keys or not self._ready("batch_exists_v2"):
            return PoolTransferResult(0, {}, [])
        kv_pages = self.batch_exists(keys, extra_info)
        hits: Dict[Any, int] = {PoolName.KV: kv_pages}
        span = list(keys[:kv_pages])
        restorable = set(range(1, kv_pages + 1))
        ns = self._namespace
        for t in pool_transfers or []:
            store = self._store(pool_name(t.name))
            policy = PoolHitPolicy(t.hit_policy)
            try:
                if policy == PoolHitPolicy.ALL_PAGES:
                    boundary = store.leading(ns, span) if store else 0
                    restorable &= set(range(1, boundary + 1))
                elif policy == PoolHitPolicy.TRAILING_PAGES:
                    window = max(1, len(t.keys or ()))
                    have = store.present(ns, span) if store else [False] * kv_pages
                    ok = _trailing_restorable(have, window)
                    boundary = max(ok, default=0)
                    restorable &= ok
                else:  # BLOCK_GROUPS: reported, never a cut
                    group = max(1, int(t.group_pages or 1))
                    have = store.present(ns, span) if store else [False] * kv_pages
                    boundary = 0
                    while boundary + group <= kv_pages and all(have[boundary:boundary + group]):
                        boundary += group
            except Exception as e:  # noqa: BLE001 - a failed query hits nothing
                logger.warning("kvbm HiCache storage: batch_exists_v2 on pool %r failed: %s",
                               pool_name(t.name), e)
                boundary = 0
                if policy != PoolHitPolicy.BLOCK_GROUPS:
                    restorable = set()
            hits[t.name] = boundary
        rs = sorted(restorable)
        return PoolTransferResult(rs[-1] if rs else 0, hits, rs)

    # ---- moves

    def batch_set_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[Any, List[bool]]:
        """Saves each transfer's pages (host_indices, the pool's slots) under
        its keys; per transfer, True per page stored (or already there)."""
        for t in transfers or []:  # the prefill rate's clocks (prefill_rate.py)
            self._prefill.backed_up(t.keys or [])
        return self._move_v2("backup", transfers)

    def batch_get_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[Any, List[bool]]:
        """Loads each transfer's keys into its host_indices; per transfer,
        True per page loaded, False for one missing or failed."""
        return self._move_v2("prefetch", transfers)

    def _move_v2(self, what: str, transfers: List[Any]) -> Dict[Any, List[bool]]:
        out: Dict[Any, List[bool]] = {}
        ready = self._ready(f"batch_{'set' if what == 'backup' else 'get'}_v2")
        for t in transfers or []:
            keys = list(t.keys or [])
            ok = [False] * len(keys)
            out[t.name] = ok
            if not keys or not ready:
                continue
            store = self._store(pool_name(t.name))
            if store is None:
                continue
            t0 = time.monotonic()
            try:
                pages = page_ids(len(keys), t.host_indices, store.layout.page_size,
                                 store.layout.num_pages)
                sel = [i for i, p in enumerate(pages) if p is not None]
                move = store.save if what == "backup" else store.load
                res = move(self._namespace, [keys[i] for i in sel], [pages[i] for i in sel])
            except Exception as e:  # noqa: BLE001 - every page of it failed
                logger.warning("kvbm HiCache storage: %s of %d %s pages failed: %s", what,
                               len(keys), store.name, e)
                continue
            for i, r in zip(sel, res):
                ok[i] = r
            self._record_pool(store, what, sum(ok), t0)
        return out

    # ---- stats, clear, close

    def _record_pool(self, store: PoolStore, what: str, pages: int, t0: float) -> None:
        if store.parts and store.parts[0].tag is None:  # the KV pool: v1's figures
            self._record(what, pages, t0)
            return
        if not pages:
            return
        gbps = pages * store.layout.page_bytes / max(time.monotonic() - t0, 1e-9) / 1e9
        with self._stats_lock:
            if len(store.moved[what + "_pgs"]) < 8192:
                store.moved[what + "_pgs"].append(pages)
                store.moved[what + "_bandwidth"].append(gbps)

    def _pool_moves(self) -> Dict[str, Dict[str, List[float]]]:
        """Each pool's moves since the last call (the KV pool's are v1's)."""
        out = {}
        with self._stats_lock:
            for name, store in self._pools.items():
                if store.parts and store.parts[0].tag is not None:
                    out[name], store.moved = store.moved, _no_moves()
        return out

    def _v2_clear(self) -> None:
        for store in list(self._pools.values()):
            try:
                store.reset()
            except Exception as e:  # noqa: BLE001
                logger.warning("kvbm HiCache storage: clear() of pool %r: %s", store.name, e)

    def _v2_close(self) -> None:
        with self._pools_lock:
            stores, self._pools = list(self._pools.values()), {}
        for store in stores:
            store.close()


def _trailing_restorable(have: List[bool], window: int) -> Set[int]:
    """Prefix lengths p (1..len(have)) whose last window pages are all
    present (fewer at the start of the span)."""
    ok: Set[int] = set()
    missing = 0  # misses among the window ending at p
    for p in range(1, len(have) + 1):
        if not have[p - 1]:
            missing += 1
        if p - window - 1 >= 0 and not have[p - window - 1]:
            missing -= 1
        if missing == 0:
            ok.add(p)
    return ok
