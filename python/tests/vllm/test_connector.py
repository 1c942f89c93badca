"""KvbmConnector with the real vLLM 0.33 scheduler: offload, onboard, errors."""
from harness import require_vllm

require_vllm()

import torch  # noqa: E402
import pytest  # noqa: E402

from harness import BLOCK, LAYERS, Engine, pattern  # noqa: E402


@pytest.fixture
def engine():
    e = Engine({"g2_blocks": 32})
    yield e
    e.close()


def test_b_loads_the_prefix_a_offloaded(engine):
    e = engine
    a_prompt = list(range(100, 100 + 2 * BLOCK + 8))          # 2 full blocks + 8
    a = e.add("A", a_prompt)
    e.run()
    a_keys = [bytes(h) for h in a.block_hashes[:2]]
    sched = e.connector._scheduler
    assert all(sched.cached_tiers(k) == {2} for k in a_keys)
    # The GPU forgets A: its blocks are reused, B's hit can only be kvbm's.
    assert e.sched.reset_prefix_cache()
    e.raw.zero_()
    b = e.add("B", a_prompt[:2 * BLOCK] + list(range(500, 510)))
    seen = {}

    def check(so):
        if "B" in so.num_scheduled_tokens and not seen:
            ids = e.block_ids("B")
            seen["ids"] = ids[:2]
            for i, key in enumerate(a_keys):
                for layer in range(len(LAYERS)):
                    assert torch.equal(e.read(ids[i], layer), pattern(key, layer)), \
                        f"block {i} (G1 {ids[i]}) layer {layer}"
            seen["computed"] = e.sched.requests["B"].num_computed_tokens
            seen["scheduled"] = so.num_scheduled_tokens["B"]
    e.run(before_forward=check)
    assert seen["scheduled"] == 10, "B computes only its own 10 tokens"
    st = e.worker._worker.worker.cache.stats()
    assert st.onboarded == 2 and st.onboarded_from_g2 == 2
    assert [bytes(h) for h in b.block_hashes[:2]] == a_keys


def _lost_block_run(e):
    """A caches 2 blocks; the scheduler's index is told (as a stale event
    would) that B's third block is cached too: B's load of it fails."""
    prompt = list(range(7, 7 + 2 * BLOCK + 1))
    a = e.add("A", prompt)
    e.run()
    assert e.sched.reset_prefix_cache()
    e.raw.zero_()
    b_prompt = prompt[:2 * BLOCK] + list(range(600, 600 + BLOCK + 3))
    b = e.add("B", b_prompt)
    lost = bytes(b.block_hashes[2])
    e.connector._scheduler.apply_events([(1, 2, lost)])
    loads = []

    def check(so):
        for ld in so.kv_connector_metadata.loads:
            loads.append(ld)
    e.run(before_forward=check)
    return a, b, loads


def test_a_block_the_cache_lost_is_reported_and_recomputed(engine):
    e = engine
    a, b, loads = _lost_block_run(e)
    assert len(loads) == 1 and len(loads[0].block_ids) == 3
    lost_id = loads[0].block_ids[2]
    reported = set().union(*(o.invalid_block_ids for o in e.outputs))
    assert reported == {lost_id}
    # Recomputed: B's third block was written by the forward and stored.
    cache = e.worker._worker.worker.cache
    assert cache.match([bytes(h) for h in b.block_hashes[:3]])[0] == 3
    st = cache.stats()
    assert st.onboard_failed >= 1


def test_a_lost_block_fails_the_request_under_policy_fail():
    e = Engine({"g2_blocks": 32}, policy="fail")
    try:
        finished = []
        orig = e.sched.update_from_output

        def spy(so, out):
            eco = orig(so, out)
            for outs in eco.values():
                for o in outs.outputs:
                    if o.finish_reason is not None:
                        finished.append((o.request_id, o.finish_reason))
            return eco
        e.sched.update_from_output = spy
        a, b, loads = _lost_block_run(e)
        reported = set().union(*(o.invalid_block_ids for o in e.outputs))
        assert reported == {loads[0].block_ids[2]}
        assert ("B", "error") in [(r, str(f.name).lower() if hasattr(f, "name") else str(f))
                                  for r, f in finished], finished
    finally:
        e.close()
