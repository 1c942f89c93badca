"""Load or recompute through kvbmgo (kvbm_load_plan), and the per-tier load
rates the cache measures for it."""
import numpy as np
import pytest

from kvbmgo import plan_load
from kvbmgo.errors import InvalidArgumentError

from test_cache import block_hashes, PAGE

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


def test_the_cache_measures_each_tiers_loads(tmp_path):
    """A load of 1.5 MiB from G2 leaves G2's rate; a small one is not
    measured (its time is mostly the call's fixed cost)."""
    from kvbmgo import LayoutConfig, Worker
    from conftest import new_worker_id
    cfg = LayoutConfig(num_blocks=16, num_layers=3, outer_dim=2, page_size=4, inner_dim=4096,
                       dtype_width=2, layout="layer_separate", block_dim="first")
    layers = [np.zeros((16, 2, 4, 4096), dtype=np.uint16) for _ in range(3)]
    with Worker(new_worker_id()) as w:
        w.register_g1(cfg, layers)
        w.allocate_g2(cfg.replace(layout="fully_contiguous"))
        w.enable_cache()
        keys = block_hashes(list(range(8 * PAGE)))
        for b in range(8):
            for a in layers:
                a[b] = b + 1
        n, _ = w.cache.offload(keys, list(range(8)))
        with n:
            assert n.wait(10)
        assert w.cache.stats().load_rate == (0.0,) * 5
        n = w.cache.onboard(keys[:1], [15])  # 192 KiB: not measured
        with n:
            assert n.wait(10)
        assert w.cache.stats().load_rate == (0.0,) * 5
        n = w.cache.onboard(keys, list(range(8, 16)))
        with n:
            assert n.wait(10)
        for b in range(8):
            assert (layers[0][8 + b] == b + 1).all()
        st = w.cache.stats()
        assert st.load_rate[2] > 0 and st.load_rate[3] == st.load_rate[4] == 0
        assert st.load_queued == (0.0,) * 5


def test_a_throttled_store_is_measured_as_such_and_turned_down(tmp_path):
    """A real S3 server behind a proxy serving 4 MB/s: the cache's loads from
    G4 (eight 192 KiB blocks) are measured near that rate, and the policy
    then recomputes a G4 prefix an engine prefilling 5,000 tokens/s would
    compute faster; the same server unthrottled is measured far faster."""
    import os
    import uuid
    from urllib.parse import urlparse
    from kvbmgo import LayoutConfig, Worker
    from conftest import new_worker_id
    from e2e_common.throttle import Throttle
    from test_cache import BLOCKS, LAYERS, OUTER
    INNER = 4096  # 192 KiB blocks: the transfer, not the request's round trip, dominates
    bucket, ep = os.environ.get("KVBM_S3_BUCKET"), os.environ.get("AWS_ENDPOINT_URL_S3")
    if not bucket or not ep:
        why = "no S3 server (`make test` starts one)"
        if os.environ.get("KVBM_REQUIRE_S3") == "1":
            pytest.fail(why)
        pytest.skip(why)
    u = urlparse(ep)
    cfg = LayoutConfig(num_blocks=BLOCKS, num_layers=LAYERS, outer_dim=OUTER, page_size=PAGE,
                       inner_dim=INNER, dtype_width=2, layout="layer_separate", block_dim="first")

    def g4_rate(endpoint):
        layers = [np.zeros((BLOCKS, OUTER, PAGE, INNER), dtype=np.uint16) for _ in range(LAYERS)]
        loc = f"s3://{bucket}/load-plan/{uuid.uuid4().hex}?endpoint={endpoint}"
        with Worker(new_worker_id(), object_dir=loc) as w:
            w.register_g1(cfg, layers)
            w.allocate_g2(cfg.replace(layout="fully_contiguous", num_blocks=8))
            w.enable_cache(g4="write-through")
            keys = block_hashes(list(range(8 * PAGE)), parent=uuid.uuid4().bytes)
            for b, key in zip(range(8), keys):
                for i, a in enumerate(layers):
                    a[b] = np.frombuffer(key * (a[b].nbytes // 32), dtype=np.uint16).reshape(
                        a[b].shape) + i
            n, _ = w.cache.offload(keys, list(range(8)))
            with n:
                assert n.wait(30)
            import time
            deadline = time.monotonic() + 30
            while w.cache.stats().g4_puts < 8:
                assert time.monotonic() < deadline, w.cache.stats()
                time.sleep(0.01)
            w.cache.reset()  # G2 forgets them: G4's only
            matched, tiers = w.cache.match(keys[:8])
            assert matched == 8 and list(tiers) == [4] * 8
            n = w.cache.onboard(keys[:8], list(range(12, 16)) + [0, 1, 2, 3])
            with n:
                assert n.wait(60)
            for b, key in zip(list(range(12, 16)) + [0, 1, 2, 3], keys[:8]):
                for i, a in enumerate(layers):
                    want = np.frombuffer(key * (a[b].nbytes // 32), dtype=np.uint16).reshape(
                        a[b].shape) + i
                    np.testing.assert_array_equal(a[b], want)
            st = w.cache.stats()
            return st.load_rate, cfg.block_bytes
    throttle = Throttle(u.hostname, u.port, 4e6)
    try:
        slow, block_bytes = g4_rate(f"http://127.0.0.1:{throttle.port}")
    finally:
        throttle.stop()
    fast, _ = g4_rate(ep)
    assert 1.5e6 < slow[4] < 5e6, slow          # about the throttle's 4 MB/s
    assert fast[4] > 3 * slow[4], (fast, slow)
    kw = dict(block_bytes=block_bytes, tokens_per_block=PAGE, prefill_tokens_per_s=5000)
    assert plan_load([4] * 8, load_rate=slow, **kw) == 0
    assert plan_load([2] * 2 + [4] * 6, load_rate=slow, **kw) == 2
