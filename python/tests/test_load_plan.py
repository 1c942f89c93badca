"""Load or recompute through kvbmgo (kvbm_load_plan), and the per-tier load
rates the cache measures for it."""
import numpy as np
import pytest

from kvbmgo import plan_load
from kvbmgo.errors import InvalidArgumentError

from test_cache import cached, compute, block_hashes, PAGE  # noqa: F401 - the fixture

MIB = 1 << 20
FAST = 20e9


def test_a_tier_slower_than_recomputing_is_not_loaded_from():
    kw = dict(block_bytes=2 * MIB, tokens_per_block=16, prefill_tokens_per_s=8000)
    assert plan_load([2] * 8, load_rate=[0, 0, FAST, 0, 0], **kw) == 8
    # G4 at 100 MB/s: 21 ms a block against 2 ms of compute: recomputed;
    # the G2 part before it is still loaded.
    rates = [0, 0, FAST, 0, 100e6]
    assert plan_load([4] * 8, load_rate=rates, **kw) == 0
    assert plan_load([2] * 5 + [4] * 5, load_rate=rates, **kw) == 5
    # Unknown prefill rate, or an unmeasured tier: loaded.
    assert plan_load([4] * 8, load_rate=rates, block_bytes=2 * MIB, tokens_per_block=16,
                     prefill_tokens_per_s=0) == 8
    assert plan_load([3] * 8, load_rate=rates, **kw) == 8
    assert plan_load([], **kw) == 0


@pytest.mark.parametrize("bad", [
    dict(tiers=[1]), dict(tiers=[5]), dict(margin=1.0), dict(margin=float("nan")),
    dict(block_bytes=0), dict(tokens_per_block=0), dict(prefill_tokens_per_s=-1),
    dict(load_rate=[0, 0, -1, 0, 0]), dict(load_queued=[0, 0, 0, float("nan"), 0]),
])
def test_bad_input_is_refused(bad):
    kw = dict(tiers=[2, 2], block_bytes=MIB, tokens_per_block=16, prefill_tokens_per_s=1000)
    kw.update(bad)
    tiers = kw.pop("tiers")
    with pytest.raises(InvalidArgumentError):
        plan_load(tiers, **kw)


def test_the_cache_measures_each_tiers_loads(cached):
    w, layers = cached
    keys = block_hashes(list(range(2 * PAGE)))
    compute(layers, [0, 1], keys)
    n, _ = w.cache.offload(keys, [0, 1])
    with n:
        assert n.wait(10)
    assert w.cache.stats().load_rate == (0.0,) * 5
    n = w.cache.onboard(keys, [5, 6])
    with n:
        assert n.wait(10)
    st = w.cache.stats()
    assert st.load_rate[2] > 0 and st.load_rate[3] == st.load_rate[4] == 0
    assert st.load_queued == (0.0,) * 5
