"""Load or recompute (load_policy "auto"): a hit is claimed only as far as
loading it is expected to end before recomputing it would, by the library's
policy (kvbm_load_plan) over what the workers measured of their loads and
what the scheduler measured of the engine's prefill (the default); "always"
claims every block held."""
from harness import require_vllm

require_vllm()

from harness import BLOCK, Engine  # noqa: E402

PROMPT = list(range(11, 11 + 4 * BLOCK + 3))


def _cached(e):
    e.add("A", PROMPT)
    e.run()
    e.settle()
    assert e.sched.reset_prefix_cache()
    e.raw.zero_()


def _hit(e, name):
    """Runs request name (A's prompt and more) checked before every forward;
    the tokens its lookup claimed from kvbm."""
    e.verify = True
    seen = []
    orig = e.connector._scheduler.get_num_new_matched_tokens

    def look(request, computed):
        out = orig(request, computed)
        if request.request_id == name and out[0] is not None:
            seen.append(out[0])
        return out
    e.connector._scheduler.get_num_new_matched_tokens = look
    try:
        e.add(name, PROMPT + [5, 5, 5])
        e.run()
    finally:
        e.connector._scheduler.get_num_new_matched_tokens = orig
    assert e.finished[name].finish_reason.name == "LENGTH"
    return seen[0]


def _declined(e):
    return sum(s.get("declined_tokens", 0) for s in e.stats)


def test_a_tier_slower_than_recomputing_is_recomputed():
    e = Engine({"g2_blocks": 32, "load_policy": "auto"}, serial=True)
    try:
        _cached(e)
        policy = e.connector._scheduler._policy
        # The workers reported their loads and the scheduler timed prefills.
        assert policy.load is not None and policy.load[2] > 0
        assert policy.prefill_rate > 0
        # G2 measured at 1 kB/s against a prefill of a million tokens a
        # second: recomputing wins, nothing is claimed, nothing lost.
        policy.load = ((0.0, 0.0, 1e3, 0.0, 0.0), (0.0,) * 5, policy.load[2])
        policy.prefill_rate = 1e6
        assert _hit(e, "B") == 0
        assert _declined(e) == 4 * BLOCK
        # G2 as fast as memory against a slow prefill: the whole prefix.
        assert e.sched.reset_prefix_cache()
        policy.load = ((0.0, 0.0, 20e9, 0.0, 0.0), (0.0,) * 5, policy.load[2])
        policy.prefill_rate = 100.0
        assert _hit(e, "C") == 4 * BLOCK
    finally:
        e.close()


def test_always_claims_every_block_whatever_was_measured():
    e = Engine({"g2_blocks": 32, "load_policy": "always"}, serial=True)
    try:
        _cached(e)
        policy = e.connector._scheduler._policy
        assert not policy.enabled
        policy.load = ((0.0, 0.0, 1e3, 0.0, 0.0), (0.0,) * 5, 4096)
        policy.prefill_rate = 1e6
        assert _hit(e, "B") == 4 * BLOCK
        assert _declined(e) == 0
    finally:
        e.close()


def test_auto_is_the_default():
    e = Engine({"g2_blocks": 32}, serial=True)
    try:
        assert e.connector._scheduler._policy.enabled
    finally:
        e.close()


def test_under_async_scheduling_each_step_is_timed_to_its_own_output():
    """vLLM's AsyncScheduler schedules step N+1 before step N's output is
    back, and calls update_connector_output only for outputs that carry
    something: each timed step still comes back with its own number, and
    none is left waiting."""
    e = Engine({"g2_blocks": 32, "load_policy": "auto"}, pipelined=True)
    try:
        policy = e.connector._scheduler._policy
        started, ended = [], []
        orig_start, orig_end = policy.step_started, policy.step_ended

        def step_started(tokens):
            n = orig_start(tokens)
            if n:
                started.append(n)
            return n

        def step_ended(load, step=0):
            if step:
                ended.append(step)
            orig_end(load, step)
        policy.step_started, policy.step_ended = step_started, step_ended
        e.add("A", PROMPT)
        e.add("B", list(range(900, 900 + 3 * BLOCK + 1)))
        e.run_pipelined()
        assert started and ended == started
        assert not policy._steps
        assert policy.prefill_rate > 0
    finally:
        e.close()


def test_a_step_is_timed_to_its_own_output_when_earlier_ones_had_none():
    """Steps 1 and 2 never hear back (their outputs carried nothing): step
    3's output times step 3, from its own start, and forgets 1 and 2."""
    from kvbmgo.vllm.load_policy import LoadPolicy
    p = LoadPolicy(True, BLOCK)
    assert p.step_started(BLOCK) == 0, "too few tokens to time"
    assert [p.step_started(100 * BLOCK) for _ in range(3)] == [1, 2, 3]
    p._steps[1] = (p._steps[1][0] - 100.0, p._steps[1][1])  # long ago: a rate near 0
    p.step_ended(None, 3)
    assert not p._steps
    assert p.prefill_rate > 1000 * BLOCK, "timed from step 3's start, not step 1's"
    p.step_ended(None, 2)  # late, already forgotten: nothing changes
    assert p.prefill_rate > 1000 * BLOCK
