"""The vLLM worker side's figures (stats.py's KvbmConnectorStats): what
each interval loaded, stored and pulled, read from the cache's counters
and the worker's own timings. KvbmWorker inherits them; the state they
keep is the worker's (its __init__ makes it)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Set, Tuple

__all__ = ["WorkerStats"]

#: The cache's counters are read at most this often for the stats.
_STATS_EVERY_S = 0.05


class WorkerStats:
    """The stats methods of KvbmWorker."""

    rank: int
    worker: Any
    config: Any
    _stats: Any
    _cache_seen: Any
    _started_at: Dict[str, Tuple[float, List[int]]]
    _moved: bool
    _looked: float
    _block_bytes: int
    _block_tokens: int

    def _load_news(self) -> Any:
        """The cache's load rates and queues at the last look at its
        counters (get_stats), with the block's bytes, when they changed since
        they were last sent (metadata.LoadReport); else None."""
        st = self._cache_seen
        if st is None or not self._block_bytes or self.worker is None or \
                self.config.load_policy != "auto":  # only the policy reads them
            return None
        load = (tuple(st.load_rate), tuple(st.load_queued), self._block_bytes)
        if load == getattr(self, "_load_sent", None):
            return None
        self._load_sent = load
        return load

    def _stat(self) -> Any:
        if self._stats is None:
            from .stats import KvbmConnectorStats
            self._stats = KvbmConnectorStats()
        return self._stats

    def _ended(self, series: str, key: str) -> None:
        started = self._started_at.pop(key, None)
        if started is not None:
            self._stat().observe(series, time.monotonic() - started[0])
            self._moved = True

    def _pulled(self, req_id: str, failed: Set[int]) -> None:
        started = self._started_at.pop("pull:" + req_id, None)
        if started is None:
            return
        t0, ids = started
        st = self._stat()
        st.observe("pull_seconds", time.monotonic() - t0)
        lost = sum(1 for b in ids if b in failed)
        if self.rank == 0:
            st.add("pulls")
            st.add("pull_blocks", len(ids) - lost)
            if lost:
                st.add("pull_failures")
                st.add("failed_blocks", lost, "pull")
        st.add("pull_bytes", (len(ids) - lost) * self._block_bytes)
        # Loaded into the GPU by kvbm too (from a prefill instance): in the
        # bytes an operator reads as kvbm's onboards.
        st.add("onboarded_bytes", (len(ids) - lost) * self._block_bytes)
        self._moved = True

    def get_stats(self) -> Any:
        """This interval's figures (KvbmConnectorStats), or None when
        nothing moved: the cache's counters are read after a step that
        started or ended a transfer, at most every _STATS_EVERY_S (a read
        costs microseconds of Python, a step of a busy engine not many
        more); what they count is exact, reported a little later."""
        now_s = time.monotonic()
        if self._moved and self.worker is not None and now_s - self._looked >= _STATS_EVERY_S:
            self._moved = False
            self._looked = now_s
            now = self.worker.cache.stats()
            was, self._cache_seen = self._cache_seen, now
            if was is not None:
                self._add_cache_deltas(was, now)
        stats = self._stats
        if stats is None or stats.is_empty():
            return None
        self._stats = None
        return stats

    def _add_cache_deltas(self, was: Any, now: Any) -> None:
        st = self._stat()
        onboarded = 0
        for tier in ("G2", "G3", "G4"):
            field_ = f"onboarded_from_{tier.lower()}"
            n = getattr(now, field_) - getattr(was, field_)
            onboarded += n
            if self.rank == 0 and n:
                st.add("onboarded_blocks", n, tier)
                st.add("onboarded_tokens", n * self._block_tokens, tier)
        st.add("onboarded_bytes", onboarded * self._block_bytes)
        offloaded = now.offloaded - was.offloaded
        st.add("offloaded_bytes", offloaded * self._block_bytes)
        if self.rank == 0:
            st.add("offloaded_blocks", offloaded)
            st.add("failed_blocks", now.onboard_failed - was.onboard_failed, "load")
            st.add("failed_blocks", now.offload_failed - was.offload_failed, "store")
