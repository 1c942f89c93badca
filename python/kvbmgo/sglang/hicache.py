"""KvbmHiCacheStorage: SGLang's HiCache storage backend (L3) over kvbm's
prefix cache.

In kvbm's terms SGLang's host KV pool is the memory kvbm loads into and
saves from (registered as kvbm's G1, without copies); kvbm keeps the pages
in its own pinned G2, its disk G3 and its object store G4, picks what to
evict and write down, dedupes, and checks a CRC on every page that comes
back from disk or the store. This class only translates SGLang's calls:

=====================================  ======================================
SGLang                                 kvbm
=====================================  ======================================
register_mem_pool_host(pool)           Worker.register_g1_host(kv_buffer),
                                       allocate_g2/g3, enable_cache
batch_exists(keys)                     cache.match(keys): the leading run
batch_set_v1(keys, host_indices)       cache.offload(keys, pages), waited
batch_get_v1(keys, host_indices)       cache.onboard(keys, pages), waited:
                                       a failed page is False
get/set/batch_get/batch_set/exists     the same through a staging area
=====================================  ======================================

A hybrid model's other host pools (Mamba, SWA, ...) go through the v2
calls (``register_mem_host_pool_v2``, ``batch_exists_v2``,
``batch_get_v2``/``batch_set_v2``): see hicache_v2.

The library loads, and the worker is created, in register_mem_pool_host.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from .._worker import Worker
from ..errors import KvbmError
from .cache_moves import chunks as _chunks, load_blocks, save_blocks
from .config import KvbmHiCacheConfig, namespace_of
from .hicache_v2 import HiCacheV2, page_ids
from .host_pool import HostPoolLayout, host_pool_layout
from .prefill_rate import PrefillRate

__all__ = ["KvbmHiCacheStorage"]

logger = logging.getLogger(__name__)

#: SGLang's controller asks and moves pages in batches of this many keys
#: (cache_controller.STORAGE_BATCH_SIZE). kvbm's G2 holds two by default: a
#: backup batch and a prefetch batch (staged through G2 when it comes from
#: G3 or G4) run at once; an offload that finds every G2 block held by a
#: transfer is refused (NO_SPACE) and reported False.
_SGLANG_BATCH = 128

_worker_ids = itertools.count(1)


#: At most this many batches are kept between two get_stats calls.
_MAX_MOVES = 8192


def _no_moves() -> Dict[str, List[float]]:
    return {k: [] for k in ("prefetch_pgs", "prefetch_bandwidth", "backup_pgs",
                            "backup_bandwidth")}


class KvbmHiCacheStorage(HiCacheV2, HiCacheStorage):
    """HiCache storage over kvbm. Built by SGLang's
    ``StorageBackendFactory.create_backend("dynamic", storage_config, ...)``
    as ``KvbmHiCacheStorage(storage_config, kwargs)``; settings come from
    ``storage_config.extra_config`` (see KvbmHiCacheConfig). Safe to use
    from SGLang's prefetch and backup threads at once."""

    def __init__(self, storage_config: Any, kwargs: Optional[Dict[str, Any]] = None) -> None:
        self.storage_config = storage_config
        self.config = KvbmHiCacheConfig.from_extra_config(
            getattr(storage_config, "extra_config", None))
        self.mem_pool_host: Any = None
        self.layout: Optional[HostPoolLayout] = None
        self._worker: Optional[Worker] = None
        self._namespace = b""
        self._g2_pages = 0
        self._staging: Any = None  # torch tensor [staging_pages, page elements]
        self._staging_lock = threading.Lock()
        self._warned: set = set()
        # get_stats: per batch, pages moved and GB/s, since the last call
        # (the prefetch and backup threads add, the scheduler's takes).
        self._stats_lock = threading.Lock()
        self._moved: Dict[str, List[float]] = _no_moves()
        self._prefill = PrefillRate(self.config.prefill_tokens_per_s, 0)
        self._v2_init()  # the other host pools of a hybrid model

    # ---- setup

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Describes SGLang's host pool to kvbm and makes the worker: the
        pool itself (interface_v1) or a staging area (copying path) as G1,
        kvbm's G2 and G3, the cache. The pool is host memory under either
        device backend (register_g1_host: pinned in place, or used as SGLang
        pinned it). Raises ValueError/TypeError for a host pool kvbm cannot
        use (host_pool_layout), KvbmError from the library."""
        if self._worker is not None:
            raise RuntimeError("kvbm HiCache storage: a host pool is registered already")
        layout = host_pool_layout(mem_pool_host)
        if getattr(self.storage_config, "should_split_heads", False):
            raise ValueError("kvbm HiCache storage: should_split_heads (tp_lcm_size) is not "
                             "supported")
        c = self.config
        sc = self.storage_config
        self._prefill.tokens_per_page = layout.config.page_size
        self._namespace = namespace_of(sc, layout.layout, layout.config.page_size,
                                       layout.config.dtype_width)
        if c.disk_dir:
            os.makedirs(c.disk_dir, mode=0o700, exist_ok=True)
        wid = c.worker_id or self._next_worker_id()
        # The worker's rank prefixes its object (G4) keys: MLA tensor ranks
        # hold the same KV (one shard per decode-context rank) and share
        # them, other models' ranks never do. Every rank writes, writer or
        # not: G2 and G3 are its own, and SGLang takes the smallest hit of
        # the tensor ranks.
        rank = int((getattr(sc, "dcp_rank", 0) if layout.mla else getattr(sc, "tp_rank", 0))
                   or 0)
        w = Worker(wid, device_id=c.device_id, rank=rank,
                   disk_dir=c.disk_dir or None, object_dir=c.object_dir or None)
        try:
            if c.interface_v1:
                w.register_g1_host(layout.config, list(layout.regions))
            else:
                import torch
                buf = mem_pool_host.kv_buffer
                page_elems = layout.page_bytes // buf.element_size()
                self._staging = torch.zeros((c.staging_pages, page_elems), dtype=buf.dtype)
                w.register_g1_host(layout.staging(c.staging_pages), self._staging)
            self._g2_pages = c.g2_pages or 2 * _SGLANG_BATCH
            if self._g2_pages < _SGLANG_BATCH:
                logger.warning(
                    "kvbm HiCache storage: g2_pages=%d is below SGLang's backup batch of %d "
                    "pages: while G2 writes a batch through, the pages it has no room for "
                    "are refused and SGLang logs \"Write page to storage ... failed\" "
                    "(nothing is lost from the host pool); give G2 at least %d pages",
                    self._g2_pages, _SGLANG_BATCH, 2 * _SGLANG_BATCH)
            w.allocate_g2(layout.staging(self._g2_pages))
            if c.disk_dir:
                w.allocate_g3(layout.staging(c.g3_pages))
            w.enable_cache(g3=c.g3_mode, g4=c.g4_mode)
        except BaseException:
            w.close()
            self._staging = None
            raise
        self.layout = layout
        self.mem_pool_host = mem_pool_host
        self._worker = w  # last: the calls check it, then use the rest
        logger.info("kvbm HiCache storage: worker %#x, %s host pool of %d pages (%d bytes "
                    "each), %s path, G2 %d pages, G3 %s, G4 %s", wid, layout.layout,
                    layout.num_pages, layout.page_bytes,
                    "zero-copy v1" if c.interface_v1 else "copying",
                    self._g2_pages, f"{c.g3_pages} pages" if c.disk_dir else "none",
                    c.object_dir or "none")

    def close(self) -> None:
        """Closes the workers (waits for their transfers)."""
        self._v2_close()
        w, self._worker = self._worker, None
        if w is not None:
            w.close()

    @staticmethod
    def _next_worker_id() -> int:
        return (os.getpid() & 0xFFFFFFFF) << 24 | next(_worker_ids)

    def clear(self) -> None:
        """Forgets every page stored so far: G2 and G3 drop them (their
        blocks take new pages), and keys move to a new namespace, so that
        pages in the object store (G4), which outlive the process and may
        be shared, are no longer found by this backend."""
        self._namespace = hashlib.sha256(b"cleared|" + self._namespace).digest()
        if self._worker is not None:
            try:
                g2, g3 = self._worker.cache.reset()
                logger.info("kvbm HiCache storage: clear() dropped %d G2 and %d G3 pages", g2, g3)
            except KvbmError as e:
                logger.warning("kvbm HiCache storage: clear(): %s", e)
        self._v2_clear()

    # ---- keys and pages

    def _key(self, key: Any) -> bytes:
        """SGLang's page key in this rank's namespace, as kvbm's key (32 bytes)."""
        raw = key.encode() if isinstance(key, str) else bytes(key)
        return hashlib.sha256(self._namespace + raw).digest()

    def _warn_once(self, what: str, msg: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(msg)

    def _pages(self, n: int, host_indices: Any) -> List[Optional[int]]:
        """SGLang's page of each key: host_indices[i * page_size] (token
        slots) / page_size; None when the slots of key i are not a whole
        page (then that key fails)."""
        return page_ids(n, host_indices, self.layout.config.page_size, self.layout.num_pages)

    def _ready(self, what: str) -> bool:
        if self._worker is None:
            self._warn_once("unregistered", f"kvbm HiCache storage: {what} before "
                            f"register_mem_pool_host: nothing stored or loaded")
            return False
        return True

    # ---- the moves, by G1 block (the host pool's page, or a staging row)

    def _offload(self, keys: List[bytes], ids: List[int]) -> List[bool]:
        """Saves G1 blocks ids under keys; True per block stored or present."""
        t0 = time.monotonic()
        ok = save_blocks(self._worker.cache, self._g2_pages, keys, ids)
        self._record("backup", sum(ok), t0)
        return ok

    def _onboard(self, keys: List[bytes], ids: List[int]) -> List[bool]:
        """Loads keys into G1 blocks ids; True per block loaded, never for
        one that failed (missing, corrupt, a failed copy)."""
        t0 = time.monotonic()
        ok = load_blocks(self._worker.cache, self._g2_pages, keys, ids)
        self._record("prefetch", sum(ok), t0)
        return ok

    # ---- storage metrics (SGLang's --enable-storage-metrics)

    def _record(self, what: str, pages: int, t0: float) -> None:
        if not pages:
            return
        seconds = max(time.monotonic() - t0, 1e-9)
        gbps = pages * self.layout.page_bytes / seconds / 1e9
        with self._stats_lock:
            if len(self._moved[what + "_pgs"]) < _MAX_MOVES:
                self._moved[what + "_pgs"].append(pages)
                self._moved[what + "_bandwidth"].append(gbps)

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics since the last call, as its built-in
        backends report them: pages per prefetch (load) and backup (store)
        batch, and each batch's GB/s (bytes moved over the call's time), of
        the KV pool; ``pools`` (an attribute of ours, as SGLang adds
        ``prefetch_stats``) holds the same per host pool by name, "kv"
        included, for a hybrid model's pools."""
        from sglang.srt.observability.metrics_collector import StorageMetrics
        with self._stats_lock:
            moved, self._moved = self._moved, _no_moves()
        m = _metrics(StorageMetrics, moved)
        m.pools = {"kv": _metrics(StorageMetrics, moved)} if self._pools else {}
        for name, pm in self._pool_moves().items():
            m.pools[name] = _metrics(StorageMetrics, pm)
        return m

    # ---- zero-copy interface (interface_v1)

    def _v1(self, what: str) -> bool:
        if not self._ready(what):
            return False
        if self._staging is not None:
            self._warn_once("v1", f"kvbm HiCache storage: {what} needs \"interface_v1\": 1 in "
                            f"extra_config (the host pool is not registered with kvbm)")
            return False
        return True

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        """Saves the host pool pages at host_indices (page_size slots per
        key) under keys; True per page stored (or already present)."""
        if not keys:
            return []
        self._prefill.backed_up(keys)
        if not self._v1("batch_set_v1"):
            return [False] * len(keys)
        pages = self._pages(len(keys), host_indices)
        sel = [i for i, p in enumerate(pages) if p is not None]
        ok = [False] * len(keys)
        res = self._offload([self._key(keys[i]) for i in sel], [pages[i] for i in sel])
        for i, r in zip(sel, res):
            ok[i] = r
        return ok

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        """Loads keys into the host pool pages at host_indices; True per
        page loaded, False for one that is missing or failed."""
        if not keys:
            return []
        if not self._v1("batch_get_v1"):
            return [False] * len(keys)
        pages = self._pages(len(keys), host_indices)
        sel = [i for i, p in enumerate(pages) if p is not None]
        ok = [False] * len(keys)
        res = self._onboard([self._key(keys[i]) for i in sel], [pages[i] for i in sel])
        for i, r in zip(sel, res):
            ok[i] = r
        return ok

    # ---- queries

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many leading keys can be loaded now."""
        if not keys or not self._ready("batch_exists"):
            return 0
        kb = [self._key(k) for k in keys]
        seen: set = set()
        for i, k in enumerate(kb):  # a key repeated ends the prefix kvbm can be asked
            if k in seen:
                kb = kb[:i]
                break
            seen.add(k)
        matched, tiers = self._worker.cache.match(kb)
        if matched < len(keys):
            self._prefill.missed(keys[-1], len(keys) - matched)
        if matched and self.config.load_policy == "auto" and self._prefill.tokens_per_s():
            matched = self._worth_loading(list(tiers)[:matched])
        return matched

    def _worth_loading(self, tiers: List[int]) -> int:
        """Load or recompute: the leading pages whose load is expected to end
        before recomputing them would (prefill_rate.py: the rate)."""
        from .. import plan_load
        st = self._worker.cache.stats()
        return plan_load(tiers, block_bytes=self.layout.page_bytes,
                         tokens_per_block=self.layout.config.page_size,
                         prefill_tokens_per_s=self._prefill.tokens_per_s(),
                         load_rate=st.load_rate, load_queued=st.load_queued)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---- copying interface, through the staging area

    def _copying(self, what: str) -> bool:
        if not self._ready(what):
            return False
        if self._staging is None:
            self._warn_once("copy", f"kvbm HiCache storage: {what} (the copying path) needs "
                            f"\"interface_v1\": 0: with interface_v1 the host pool itself is "
                            f"registered with kvbm and there is no staging area")
            return False
        return True

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Saves flat pages values[i] (SGLang's get_data_page(..., flat=True))
        under keys; True when every page was stored."""
        self._prefill.backed_up(keys or [])
        return all(self._set_pages(keys, values)) if keys else True

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        return self._set_pages([key], [value])[0]

    def _set_pages(self, keys: List[str], values: Any) -> List[bool]:
        if not self._copying("set"):
            return [False] * len(keys)
        if values is None or len(values) != len(keys):
            raise ValueError(f"kvbm HiCache storage: {len(keys)} keys for "
                             f"{None if values is None else len(values)} values")
        ok = [False] * len(keys)
        rows = self._staging.shape[0]
        with self._staging_lock:
            for chunk in _chunks(list(range(len(keys))), rows):
                use = []
                for r, i in enumerate(chunk):
                    v = values[i]
                    if v is None or v.numel() * v.element_size() != self.layout.page_bytes:
                        self._warn_once("size", f"kvbm HiCache storage: a value of "
                                        f"{None if v is None else v.numel() * v.element_size()}"
                                        f" bytes, a page is {self.layout.page_bytes}")
                        continue
                    self._staging[r].copy_(v.reshape(-1).view(self._staging.dtype))
                    use.append((r, i))
                res = self._offload([self._key(keys[i]) for _, i in use], [r for r, _ in use])
                for (_, i), x in zip(use, res):
                    ok[i] = x
        return ok

    def batch_get(self, keys: List[str], target_locations: Any = None,
                  target_sizes: Any = None) -> List[Any]:
        """Loads keys as flat pages: into target_locations[i] when given
        (SGLang's dummy pages), else into new tensors; None for a key that
        is missing or failed."""
        if not keys:
            return []
        if not self._copying("get"):
            return [None] * len(keys)
        out: List[Any] = [None] * len(keys)
        rows = self._staging.shape[0]
        with self._staging_lock:
            for chunk in _chunks(list(range(len(keys))), rows):
                res = self._onboard([self._key(keys[i]) for i in chunk], list(range(len(chunk))))
                for r, (i, loaded) in enumerate(zip(chunk, res)):
                    if not loaded:
                        continue
                    page = self._staging[r]
                    t = target_locations[i] if target_locations is not None else None
                    if t is None:
                        out[i] = page.clone()
                    elif t.numel() * t.element_size() != self.layout.page_bytes:
                        self._warn_once("size", f"kvbm HiCache storage: a target of "
                                        f"{t.numel() * t.element_size()} bytes, a page is "
                                        f"{self.layout.page_bytes}")
                    else:
                        t.copy_(page.view(t.dtype).reshape(t.shape))
                        out[i] = t
        return out

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def __repr__(self) -> str:
        return (f"KvbmHiCacheStorage({'v1' if self.config.interface_v1 else 'copying'}, "
                f"{self.layout.layout if self.layout else 'no host pool'})")


def _metrics(cls: Any, moved: Dict[str, List[float]]) -> Any:
    m = cls()
    m.prefetch_pgs.extend(int(n) for n in moved["prefetch_pgs"])
    m.backup_pgs.extend(int(n) for n in moved["backup_pgs"])
    m.prefetch_bandwidth.extend(moved["prefetch_bandwidth"])
    m.backup_bandwidth.extend(moved["backup_bandwidth"])
    return m
