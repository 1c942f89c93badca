"""Load or recompute, on the scheduler side (load_policy "auto"): a hit is
claimed only as far as loading its blocks is expected to end before
computing them would. The decision is the library's (kvbm_load_plan, one
policy for every engine); this module gathers what it weighs: the tiers'
load rates and queues the workers measured (their KvbmWorkerMetadata.load),
and the engine's prefill rate, learned from its own steps (tokens a step
scheduled over the time from its metadata to its output)."""

from __future__ import annotations

import time
from collections import deque
from typing import Deque, Optional, Sequence, Tuple

from .metadata import LoadReport

__all__ = ["LoadPolicy"]

#: A step counts toward the prefill rate when it scheduled at least this
#: many blocks' tokens (decode-only steps say little of a prefill).
_PREFILL_STEP_BLOCKS = 4
#: The weight of the newest step in the prefill rate's moving average.
_WEIGHT = 0.3


class LoadPolicy:
    def __init__(self, enabled: bool, block_size: int) -> None:
        self.enabled = enabled
        self.block_size = block_size
        self.load: Optional[LoadReport] = None
        self.prefill_rate = 0.0  # tokens per second; 0: not measured yet
        self._steps: Deque[Tuple[float, int]] = deque(maxlen=64)

    def step_started(self, tokens: int) -> None:
        """build_connector_meta: a step scheduling tokens goes to the workers."""
        if self.enabled:
            self._steps.append((time.monotonic(), tokens))

    def step_ended(self, load: Optional[LoadReport]) -> None:
        """update_connector_output: the oldest step's output is back, with
        what the workers measured of their loads (None: nothing new)."""
        if load is not None:
            self.load = load
        if not self._steps:
            return
        t0, tokens = self._steps.popleft()
        elapsed = time.monotonic() - t0
        if tokens < _PREFILL_STEP_BLOCKS * self.block_size or elapsed <= 0:
            return
        rate = tokens / elapsed
        self.prefill_rate = rate if not self.prefill_rate else \
            (1 - _WEIGHT) * self.prefill_rate + _WEIGHT * rate

    def blocks_to_load(self, tiers: Sequence[int]) -> int:
        """Of a matched prefix whose block i is in tier tiers[i], how many
        leading blocks to load (all, until the workers reported loads)."""
        if not self.enabled or self.load is None or not tiers:
            return len(tiers)
        from .. import plan_load
        rates, queued, block_bytes = self.load
        return plan_load(tiers, block_bytes=block_bytes, tokens_per_block=self.block_size,
                         prefill_tokens_per_s=self.prefill_rate, load_rate=rates,
                         load_queued=queued)
