"""Load or recompute (kvbm_load_plan): how many leading blocks of a matched
prefix are worth loading, given where each is and how fast each tier's
loads and the engine's prefill run. The policy is the library's; engine
adapters ask it with what they measured."""

from __future__ import annotations

from ctypes import byref, c_int32, c_size_t, sizeof
from typing import Sequence

from . import _lib
from ._lib import lib

__all__ = ["plan_load"]


def plan_load(tiers: Sequence[int], *, block_bytes: float, tokens_per_block: int,
              prefill_tokens_per_s: float, load_rate: Sequence[float] = (0.0,) * 5,
              load_queued: Sequence[float] = (0.0,) * 5, margin: float = 0.1) -> int:
    """The number of leading blocks to load of a prefix whose block i is in
    tier tiers[i] (2, 3 or 4): those whose expected load ends before
    computing them would, by margin (a fraction of the compute time).
    load_rate and load_queued are by tier number (CacheStats's; 0: not
    measured, taken as fast); prefill_tokens_per_s 0: unknown, every block
    is loaded. Raises InvalidArgumentError for a tier out of range or a
    value that is not a number >= 0 (margin: in [0, 1))."""
    c = _lib.LoadPlanInputC()
    c.struct_size = sizeof(c)
    c.block_bytes, c.prefill_tokens_per_s, c.margin = \
        float(block_bytes), float(prefill_tokens_per_s), float(margin)
    c.tokens_per_block = int(tokens_per_block) if 0 < int(tokens_per_block) < 2**32 else 0
    for i in range(5):
        c.load_rate[i] = float(load_rate[i]) if i < len(load_rate) else 0.0
        c.load_queued[i] = float(load_queued[i]) if i < len(load_queued) else 0.0
    arr = (c_int32 * len(tiers))(*(int(t) if -2**31 <= int(t) < 2**31 else -1 for t in tiers))
    out = c_size_t()
    lib.kvbm_load_plan(arr, len(tiers), byref(c), byref(out))
    return int(out.value)
