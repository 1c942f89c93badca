"""SGLang's prefill rate as the storage backend sees it, for the load policy
(kvbm_load_plan), learned when the operator gives none: a hit query whose
pages miss from some key on starts a clock for those pages; SGLang computes
them (in chunks, perhaps), writes them to its host pool and backs them up
here, and the backup of the last missed key stops it. The pages' tokens
over that time are mostly below the prefill rate (the time holds the
request's wait in the queue and the backup's), sometimes above it (another
request computed the same pages first); the policy takes the median of the
recent ones. A rate too low makes it expect recomputing to take longer
than it does, so it loads rather than recomputes when in doubt, as with no
policy. The prefetch thread (queries) and the backup thread share it."""

from __future__ import annotations

import statistics
import threading
import time
from collections import OrderedDict, deque
from typing import Deque, Iterable, Optional, Tuple

__all__ = ["PrefillRate"]

#: Clocks kept for misses whose pages were not backed up (yet); the oldest
#: go first.
_PENDING = 1024
#: Recent samples the rate is the median of.
_SAMPLES = 32


class PrefillRate:
    def __init__(self, given: float, tokens_per_page: int) -> None:
        self.given = float(given)
        self.tokens_per_page = tokens_per_page
        self._lock = threading.Lock()
        self._pending: "OrderedDict[str, Tuple[float, int]]" = OrderedDict()
        self._samples: Deque[float] = deque(maxlen=_SAMPLES)

    def tokens_per_s(self) -> float:
        """The operator's rate, else the learned one; 0 while unknown."""
        if self.given > 0:
            return self.given
        with self._lock:
            return statistics.median(self._samples) if self._samples else 0.0

    def missed(self, last_key: str, pages: int, now: Optional[float] = None) -> None:
        """A hit query found its last pages pages missing, last_key the last."""
        if self.given > 0 or pages <= 0:
            return
        with self._lock:
            if last_key in self._pending:
                return
            self._pending[last_key] = (time.monotonic() if now is None else now, pages)
            while len(self._pending) > _PENDING:
                self._pending.popitem(last=False)

    def backed_up(self, keys: Iterable[str], now: Optional[float] = None) -> None:
        """SGLang backs up keys (after computing them)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if not self._pending:
                return
            for k in keys:
                started = self._pending.pop(k, None)
                if started is not None and now > started[0]:
                    self._samples.append(started[1] * self.tokens_per_page / (now - started[0]))
