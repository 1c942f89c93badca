"""A real vLLM engine (CPU) generating through KvbmConnector, against the same
engine without it: tokens equal, and every loaded block's bytes equal to what
was stored under its key (recording.py)."""
import os
import signal

import pytest

from e2e_helpers import BLOCK, Engine, free_port, prompt, records, require_bytes_checked

PROMPT_TOKENS = 300
HIT = (PROMPT_TOKENS - 1) // BLOCK * BLOCK   # 288: whole blocks, the last token computed


@pytest.fixture(scope="module")
def g3_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("g3"))


@pytest.fixture(scope="module")
def sync_engine(model_dir, g3_root):
    e = Engine(model_dir, {"g2_blocks": 24, "g3_dir": g3_root, "g3_blocks": 96,
                           "load_mode": "sync"}, name="sync")
    yield e
    e.close()


@pytest.fixture(scope="module")
def async_engine(model_dir):
    e = Engine(model_dir, {"g2_blocks": 64, "load_mode": "async"}, name="async")
    yield e
    e.close()


def reload(engine, expect, seed: int, is_async: bool = False):
    """Generates a prompt, resets vLLM's prefix cache with G1 scribbled over,
    generates it again: the second time its whole blocks come from kvbm."""
    p = prompt(seed)
    want = expect([p], 8)
    first = engine.generate([p], 8)
    assert first["tokens"] == want
    engine.call("reset", scribble=True)
    again = engine.generate([p], 8)
    return want, again


def test_reload_from_g2_after_reset(sync_engine, baseline):
    want, again = reload(sync_engine, baseline, 1)
    assert again["tokens"] == want
    assert [r["tokens"] for r in records(again, "external")] == [HIT]
    require_bytes_checked(again, HIT // BLOCK)


def test_broken_connector_is_caught(sync_engine, baseline):
    """The byte check sees what tokens cannot: a load into reversed block ids
    (the prefix's blocks swapped among themselves)."""
    was = sync_engine.call("break", reverse=True)["was"]
    try:
        want, again = reload(sync_engine, baseline, 2)
    finally:
        sync_engine.call("break", reverse=was)
        sync_engine.call("reset", scribble=True)  # drop the wrong KV from vLLM's cache
    loaded = records(again, "loaded")
    assert loaded and sum(r["bad"] for r in loaded) > 0, again["records"]
    print(f"broken connector: tokens equal: {again['tokens'] == want}; "
          f"blocks with wrong bytes: {sum(r['bad'] for r in loaded)} of "
          f"{sum(r['blocks'] for r in loaded)}")


def test_eviction_to_g3_and_back(sync_engine, baseline):
    """G2 holds 24 blocks: three more prompts of 9 blocks push the first one's
    blocks down to G3, from where the reload brings them back."""
    first = prompt(3)
    assert sync_engine.generate([first], 8)["tokens"] == baseline([first], 8)
    for seed in (4, 5, 6):
        p = prompt(seed)
        assert sync_engine.generate([p], 8)["tokens"] == baseline([p], 8)
    before = sync_engine.call("stats")["stats"][0]
    assert before["written_down"] > 0, before
    sync_engine.call("reset", scribble=True)
    again = sync_engine.generate([first], 8)
    after = sync_engine.call("stats")["stats"][0]
    assert again["tokens"] == baseline([first], 8)
    assert [r["tokens"] for r in records(again, "external")] == [HIT]
    require_bytes_checked(again, HIT // BLOCK)
    from_g3 = after["onboarded_from_g3"] - before["onboarded_from_g3"]
    assert from_g3 > 0, (before, after)
    print(f"eviction: {from_g3} of {HIT // BLOCK} blocks came back from G3")


def test_preemption_under_concurrent_requests(sync_engine, baseline):
    """Four requests of 300 + 160 tokens (15 blocks each) on a G1 of 24
    blocks: vLLM preempts, and a preempted request's blocks that vLLM's own
    cache lost come back from kvbm."""
    sync_engine.call("reset", scribble=True)
    ps = [prompt(seed) for seed in (10, 11, 12, 13)]
    want = [baseline([p], 160)[0] for p in ps]
    got = sync_engine.generate(ps, 160)
    assert got["tokens"] == want
    assert records(got, "preempted"), "no request was preempted"
    loaded = records(got, "loaded")
    for r in loaded:
        assert r["bad"] == 0 and r["unknown"] == 0 and r["failed"] == 0, r
    print(f"preemption: {sum(len(r['reqs']) for r in records(got, 'preempted'))} preemptions, "
          f"{len(loaded)} loads, {sum(r['blocks'] for r in loaded)} blocks checked, external "
          f"hits {[r['tokens'] for r in records(got, 'external')]}")
    assert loaded, "no preempted request was reloaded from kvbm"


def test_sigkill_leaves_no_file(sync_engine, g3_root):
    """Last of the module: the engine (its G3 holds blocks) is SIGKILLed, so
    the connector's shutdown never runs; no file stays in g3_dir, and the
    next worker to start sweeps the dead process's directory."""
    assert sync_engine.call("stats")["stats"][0]["g3"]["registered"] > 0
    dirs = os.listdir(g3_root)
    assert dirs == [d for d in dirs if d.startswith(f"kvbm-rank0-pid{sync_engine.pid}-")], dirs
    os.kill(sync_engine.pid, signal.SIGKILL)
    sync_engine.p.wait(30)
    files = [os.path.join(d, f) for d, _, fs in os.walk(g3_root) for f in fs]
    assert files == []
    from kvbmgo.vllm.g3_dirs import sweep_g3_dirs
    assert len(sweep_g3_dirs(g3_root)) == len(dirs)
    assert os.listdir(g3_root) == []


def test_async_reload_from_g2(async_engine, baseline):
    want, again = reload(async_engine, baseline, 20, is_async=True)
    assert again["tokens"] == want
    assert [r["tokens"] for r in records(again, "external")] == [HIT]
    require_bytes_checked(again, HIT // BLOCK, is_async=True)


def test_async_broken_connector_is_caught(async_engine, baseline):
    was = async_engine.call("break", reverse=True)["was"]
    try:
        _, again = reload(async_engine, baseline, 21, is_async=True)
    finally:
        async_engine.call("break", reverse=was)
        async_engine.call("reset", scribble=True)
    loaded = records(again, "loaded")
    assert loaded and sum(r["bad"] for r in loaded) > 0, again["records"]
