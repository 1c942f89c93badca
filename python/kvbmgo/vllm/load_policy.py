"""Load or recompute, on the scheduler side (load_policy "auto"): a hit is
claimed only as far as loading its blocks is expected to end before
computing them would. The decision is the library's (kvbm_load_plan, one
policy for every engine); this module gathers what it weighs: the tiers'
load rates and queues the workers measured (their KvbmWorkerMetadata.load),
and the engine's prefill rate, learned from its own steps (tokens a step
scheduled over the time from its metadata to its output). A timed step has
a number the workers send back with its output: vLLM calls
update_connector_output only for outputs that carry something (a step of
no tokens, or one whose workers had nothing to say, has none), so steps
cannot be paired with outputs in order."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Optional, Sequence, Tuple

from .metadata import LoadReport

__all__ = ["LoadPolicy"]

#: A step counts toward the prefill rate when it scheduled at least this
#: many blocks' tokens (decode-only steps say little of a prefill).
_PREFILL_STEP_BLOCKS = 4
#: The weight of the newest step in the prefill rate's moving average.
_WEIGHT = 0.3
#: Timed steps whose output is awaited, at most (pipeline stages and async
#: scheduling keep a few in flight).
_TIMED_STEPS = 64


class LoadPolicy:
    def __init__(self, enabled: bool, block_size: int) -> None:
        self.enabled = enabled
        self.block_size = block_size
        self.load: Optional[LoadReport] = None
        self.prefill_rate = 0.0  # tokens per second; 0: not measured yet
        self._steps: "OrderedDict[int, Tuple[float, int]]" = OrderedDict()  # by number
        self._number = 0

    def step_started(self, tokens: int) -> int:
        """build_connector_meta: a step scheduling tokens goes to the
        workers. Its number when it is timed (a prefill's), else 0."""
        if not self.enabled or tokens < _PREFILL_STEP_BLOCKS * self.block_size:
            return 0
        self._number += 1
        self._steps[self._number] = (time.monotonic(), tokens)
        while len(self._steps) > _TIMED_STEPS:
            self._steps.popitem(last=False)
        return self._number

    def step_ended(self, load: Optional[LoadReport], step: int = 0) -> None:
        """update_connector_output: what the workers measured of their loads
        (None: nothing new), and the timed step this output ends (0: none).
        Timed steps before it had no output of their own: forgotten."""
        if load is not None:
            self.load = load
        started = self._steps.pop(step, None) if step else None
        while self._steps and next(iter(self._steps)) < step:
            self._steps.popitem(last=False)
        if started is None:
            return
        t0, tokens = started
        elapsed = time.monotonic() - t0
        if elapsed <= 0:
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
