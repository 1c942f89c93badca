"""The stores the scheduler side asked for and has not heard the end of.

The scheduler's index learns of a stored block from the cache's events,
which a worker sends with the output of a step after the store landed: a
request arriving right after the one that computed its prefix finished
would miss the blocks still on their way and recompute them. So each
step's stores are a batch the workers say is over (KvbmWorkerMetadata
settled: landed, deduplicated, refused or failed; the events say which),
and a prefix that runs into keys of a batch not over yet is waited for
(get_num_new_matched_tokens says None: vLLM asks again next step). Only the
events make a key a hit: a block the cache refused is never claimed.

The waits are bounded (a worker that never says, a prefix offered again
and again): a batch is forgotten, and a request stops waiting, after
STORE_WAIT_S.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Container, Dict, Iterable, List

__all__ = ["StoresInFlight", "STORE_WAIT_S"]

log = logging.getLogger(__name__)

#: The longest a batch stays in flight, and a request waits for one.
STORE_WAIT_S = 5.0


@dataclass
class _Batch:
    keys: List[bytes]
    ranks: int      # workers yet to say it is over
    t0: float       # time.monotonic() when it was offered


class _Either:
    """A key the index holds or a store carries."""

    def __init__(self, index: Container[bytes], keys: Container[bytes]) -> None:
        self._index, self._keys = index, keys

    def __contains__(self, key: object) -> bool:
        return key in self._index or key in self._keys


class StoresInFlight:
    def __init__(self, ranks: int, wait_s: float = STORE_WAIT_S) -> None:
        """ranks: the workers that run every batch (tensor-parallel size)."""
        self._ranks = max(1, ranks)
        self._wait_s = wait_s
        self._last = 0
        self._batches: "OrderedDict[int, _Batch]" = OrderedDict()  # oldest first
        self._keys: Dict[bytes, int] = {}        # key -> batches carrying it
        self._waiting: Dict[str, float] = {}     # request -> its first wait
        self._warned = False

    def offer(self, keys: Iterable[bytes]) -> int:
        """A step's stores: their batch id for the metadata (0: none)."""
        ks = list(dict.fromkeys(keys))  # the worker stores a key once a step
        if not ks:
            return 0
        self._last += 1
        self._batches[self._last] = _Batch(ks, self._ranks, time.monotonic())
        for k in ks:
            self._keys[k] = self._keys.get(k, 0) + 1
        return self._last

    def settled(self, batch_ids: Iterable[int]) -> None:
        """Workers said these batches are over (each rank once)."""
        for b in batch_ids:
            batch = self._batches.get(b)
            if batch is not None:
                batch.ranks -= 1
                if batch.ranks <= 0:
                    self._drop(b)

    def expire(self) -> None:
        """Forgets the batches older than wait_s (their workers never said)."""
        now = time.monotonic()
        while self._batches:
            b, batch = next(iter(self._batches.items()))
            if now - batch.t0 < self._wait_s:
                break
            if not self._warned:
                self._warned = True
                log.warning("kvbm: a store of %d blocks was not reported over within %.0f s; "
                            "requests no longer wait for it", len(batch.keys), self._wait_s)
            self._drop(b)

    def _drop(self, b: int) -> None:
        for k in self._batches.pop(b).keys:
            n = self._keys[k] - 1
            if n:
                self._keys[k] = n
            else:
                del self._keys[k]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def with_index(self, index: Container[bytes]) -> Container[bytes]:
        """The keys index holds or a batch in flight carries."""
        return _Either(index, self._keys)

    def may_wait(self, req_id: str) -> bool:
        """Whether req_id may wait (again) for stores in flight: for at
        most wait_s from its first wait."""
        now = time.monotonic()
        return now - self._waiting.setdefault(req_id, now) < self._wait_s

    def done_waiting(self, req_id: str) -> None:
        self._waiting.pop(req_id, None)
