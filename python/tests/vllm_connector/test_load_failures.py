"""A failed load never leaves wrong KV in kvbm: vLLM's rule (its
test_invalid_blocks_correctness, test_cache_pollution_prevention) is that the
first block that failed to load and every block after it in that request
are uncomputed; a block computed over the failed one in the same step (a
sync load) is wrong and must not be stored, so that a later request with the
prefix loads only right bytes."""
from harness import require_vllm

require_vllm()

import pytest  # noqa: E402

from harness import BLOCK, Engine  # noqa: E402


def _fail_in_the_middle(e):
    """A caches P0. B is P0 + X1 + X2 + X3 + 5 tokens, and the scheduler's
    index is told (as a stale event would) that X1 is cached: B loads
    [P0, X1], X1 fails; with a sync load the same step computes X2 and X3
    over it. Returns B and the steps that ran with it."""
    prompt = list(range(11, 11 + BLOCK + 1))
    e.add("A", prompt)
    e.run()
    e.settle()
    assert e.sched.reset_prefix_cache()
    e.raw.zero_()
    b_prompt = prompt[:BLOCK] + list(range(2000, 2000 + 3 * BLOCK + 5))
    b = e.add("B", b_prompt)
    e.connector._scheduler.apply_events([(1, 2, bytes(b.block_hashes[1]))])
    steps = []
    e.run(before_forward=steps.append)
    e.settle()
    return b, steps


@pytest.mark.parametrize("load_mode", ["sync", "async"])
@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_no_block_at_or_after_a_failed_load_is_stored(load_mode, policy):
    e = Engine({"g2_blocks": 32, "load_mode": load_mode}, policy=policy, max_batched=128)
    try:
        cache = e.worker._worker.worker.cache
        b, steps = _fail_in_the_middle(e)
        keys = [bytes(h) for h in b.block_hashes[:4]]
        loads = [ld for so in steps for ld in so.kv_connector_metadata.loads]
        assert len(loads) == 1 and loads[0].keys == keys[:2]
        reported = set().union(*(o.invalid_block_ids for o in e.outputs))
        assert reported == {loads[0].block_ids[1]}
        st = cache.stats()
        if policy == "fail":
            # B ended with an error and nothing of it after P0 was stored.
            assert e.finished["B"].finish_reason.name == "ERROR"
            assert cache.match(keys)[0] == 1
            assert st.offloaded == 1 and st.deduped == 0, st
            # The stale entry goes (as the cache's removal event would).
            e.connector._scheduler.apply_events([(2, 2, keys[1])])
        else:
            # Recomputed: X1, X2, X3 offered once each, after the
            # recompute (an X2 or X3 offered over the failed X1 would have
            # been stored then, and the right one deduplicated away later),
            # with right bytes: a request that loads them checks below.
            assert cache.match(keys)[0] == 4
            assert st.offloaded == 4 and st.deduped == 0, st
        # C has B's prefix: what kvbm gives it is right, byte for byte.
        assert e.sched.reset_prefix_cache()
        e.raw.zero_()
        e.verify = True  # every computed block checked before every forward
        c = e.add("C", list(b.prompt_token_ids[:4 * BLOCK]) + [9, 9, 9])
        e.run()
        assert [bytes(h) for h in c.block_hashes[:4]] == keys
    finally:
        e.close()


def test_async_scheduling_stores_nothing_computed_over_a_failed_sync_load():
    # vLLM 0.33 schedules and runs step N+1 before step N's output (and its
    # invalid_block_ids) reaches the scheduler: N+1 computes more of B over
    # the failed X1. None of that may be stored either.
    e = Engine({"g2_blocks": 64}, max_batched=32, pipelined=True)
    try:
        prompt = list(range(11, 11 + BLOCK + 1))
        e.add("A", prompt)
        e.run_pipelined()
        e.idle()
        e.add("A2", prompt)  # a step so the scheduler hears A's stores
        e.run_pipelined()
        assert e.sched.reset_prefix_cache()
        e.raw.zero_()
        b = e.add("B", prompt[:BLOCK] + list(range(2000, 2000 + 5 * BLOCK + 5)))
        e.connector._scheduler.apply_events([(1, 2, bytes(b.block_hashes[1]))])
        e.run_pipelined()
        e.idle()
        keys = [bytes(h) for h in b.block_hashes[:6]]
        cache = e.worker._worker.worker.cache
        assert cache.stats().deduped == 0, cache.stats()
        # C has B's prefix: what kvbm gives it is right, byte for byte.
        assert e.sched.reset_prefix_cache()
        e.raw.zero_()
        e.verify = True
        c = e.add("C", list(b.prompt_token_ids[:6 * BLOCK]) + [9, 9, 9])
        e.run_pipelined()
        assert [bytes(h) for h in c.block_hashes[:6]] == keys
        assert cache.stats().onboarded >= 2
    finally:
        e.close()
