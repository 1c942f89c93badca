"""The real engine on a hybrid model (e2e_common/hybrid_model.py: a
sliding-window layer and a full-attention one) through KvbmConnector with
vLLM's hybrid KV cache manager on: two KV cache groups sharing G1's pages,
each cached under keys of its own. The scenarios of test_engine.py, against
the same model without the connector: every group's loaded blocks hold
the bytes stored under their keys, in the ids vLLM's table gives them (no
null block, no block outside the window), and tokens equal. The bytes are
checked first: a broken connector (KVBM_E2E_BREAK=reverse or stale_window)
fails on them, whatever the tokens do."""
import pytest

from e2e_helpers import BLOCK, WINDOW, bad_per_group, prompt, records, require_groups_loaded, \
    swa_engine

PROMPT_TOKENS = 300
HIT = (PROMPT_TOKENS - 1) // BLOCK * BLOCK   # 288: whole blocks, the last token computed
# The window blocks vLLM keeps for a hit of HIT tokens: those that reach into
# the window of token HIT (the first computed after the hit).
WINDOW_BLOCKS = HIT // BLOCK - (HIT - WINDOW + 1) // BLOCK   # 2


@pytest.fixture(scope="module")
def engine(swa_model_dir, tmp_path_factory):
    """G2 of 24 blocks over a G3 of 96: a prompt stores 18 (9 per group)."""
    e = swa_engine(swa_model_dir, {"g2_blocks": 24, "g3_blocks": 96,
                                   "g3_dir": str(tmp_path_factory.mktemp("g3-swa"))},
                   name="swa-kvbm")
    yield e
    e.close()


@pytest.fixture(scope="module")
def groups(engine):
    """{"window": index, "full": index} of vLLM's two KV cache groups."""
    desc = engine.call("groups")
    kinds = {g["spec"]: i for i, g in enumerate(desc["groups"])}
    return {"window": kinds["SlidingWindowSpec"], "full": kinds["FullAttentionSpec"]}


def test_hybrid_kv_cache_manager_is_on(engine):
    """vLLM keeps its hybrid KV cache manager on with KvbmConnector: two
    groups of one layer each (sliding window of WINDOW tokens, full
    attention) of one page size, and the connector keeps both."""
    desc = engine.call("groups")
    assert desc["hma"], desc
    specs = sorted((g["spec"], g["sliding_window"], g["block_size"], len(g["layers"]))
                   for g in desc["groups"])
    assert specs == [("FullAttentionSpec", None, BLOCK, 1),
                     ("SlidingWindowSpec", WINDOW, BLOCK, 1)], desc
    assert len({g["page_size_bytes"] for g in desc["groups"]}) == 1, desc
    engine.log.flush()
    with open(engine.log.name) as f:
        log = f.read()
    assert "Turning off hybrid kv cache manager" not in log
    assert "stores and loads no KV" not in log


def reload(engine, expect, seed: int):
    """Generates a prompt, resets vLLM's prefix cache with G1 scribbled over,
    generates it again: the second time its hit comes from kvbm."""
    p = prompt(seed, PROMPT_TOKENS)
    want = expect([p], 8)
    assert engine.generate([p], 8)["tokens"] == want
    engine.call("reset", scribble=True)
    return want, engine.generate([p], 8)


def test_hybrid_reload_from_g2_after_reset(engine, groups, swa_baseline):
    want, again = reload(engine, swa_baseline, 101)
    assert [r["tokens"] for r in records(again, "external")] == [HIT]
    require_groups_loaded(again, {groups["full"]: HIT // BLOCK,
                                  groups["window"]: WINDOW_BLOCKS})
    assert again["tokens"] == want


def broken(engine, expect, seed: int, **brk):
    """reload with a break of recording.py on, then off again (vLLM's cache,
    which holds the wrong KV, reset)."""
    was = engine.call("break", **{"reverse": False, **brk})
    try:
        return reload(engine, expect, seed)
    finally:
        engine.call("break", reverse=was["was"], stale_window=was["was_stale_window"])
        engine.call("reset", scribble=True)


def test_hybrid_reversed_load_is_caught(engine, swa_baseline):
    """A load into reversed ids (keys of both groups, in block order) puts
    blocks where they do not belong: the byte check sees it."""
    want, again = broken(engine, swa_baseline, 102, reverse=True)
    bad = bad_per_group(again)
    assert sum(bad.values()) > 0, again["records"]
    print(f"reverse: tokens equal: {again['tokens'] == want}; wrong bytes per group {bad}")


def test_hybrid_stale_window_block_is_caught(engine, groups, swa_baseline):
    """Window blocks stored from stale ids (each from the id of the block
    before it): their load brings the wrong bytes into the window group
    only, which the byte check sees whether or not the tokens change."""
    want, again = broken(engine, swa_baseline, 103, stale_window=True)
    bad = bad_per_group(again)
    assert bad.get(groups["window"], 0) == WINDOW_BLOCKS, again["records"]
    assert bad.get(groups["full"], 0) == 0, again["records"]
    print(f"stale window: tokens equal: {again['tokens'] == want}; wrong bytes per group {bad}")


def test_hybrid_eviction_to_g3_and_back(engine, groups, swa_baseline):
    """A prompt stores 18 blocks (9 per group) in a G2 of 24: three more
    push the first one's down to G3, from where the reload brings them."""
    first = prompt(104, PROMPT_TOKENS)
    assert engine.generate([first], 8)["tokens"] == swa_baseline([first], 8)
    for seed in (105, 106, 107):
        p = prompt(seed, PROMPT_TOKENS)
        assert engine.generate([p], 8)["tokens"] == swa_baseline([p], 8)
    before = engine.call("stats")["stats"][0]
    assert before["written_down"] > 0, before
    engine.call("reset", scribble=True)
    again = engine.generate([first], 8)
    after = engine.call("stats")["stats"][0]
    assert [r["tokens"] for r in records(again, "external")] == [HIT]
    require_groups_loaded(again, {groups["full"]: HIT // BLOCK,
                                  groups["window"]: WINDOW_BLOCKS})
    assert again["tokens"] == swa_baseline([first], 8)
    from_g3 = after["onboarded_from_g3"] - before["onboarded_from_g3"]
    assert from_g3 > 0, (before, after)
    print(f"hybrid eviction: {from_g3} of {HIT // BLOCK + WINDOW_BLOCKS} blocks from G3")


def test_hybrid_preemption_under_concurrent_requests(engine, swa_baseline):
    """Four requests of 300 + 160 tokens on a G1 of 34 pages: vLLM
    preempts, and what a preempted request's blocks lost comes back from
    kvbm, each group's where vLLM's table says."""
    engine.call("reset", scribble=True)
    ps = [prompt(seed, PROMPT_TOKENS) for seed in (110, 111, 112, 113)]
    want = [swa_baseline([p], 160)[0] for p in ps]
    got = engine.generate(ps, 160)
    assert records(got, "preempted"), "no request was preempted"
    for m in records(got, "load_map"):
        assert m["null"] == m["wrong"] == m["out_of_window"] == m["window_missing"] == 0, m
    loaded = records(got, "loaded")
    for r in loaded:
        assert r["bad"] == 0 and r["unknown"] == 0 and r["failed"] == 0, r
    assert got["tokens"] == want
    print(f"hybrid preemption: {sum(len(r['reqs']) for r in records(got, 'preempted'))} "
          f"preemptions, {len(loaded)} loads, blocks per group "
          f"{[r['groups'] for r in loaded]}, external hits "
          f"{[r['tokens'] for r in records(got, 'external')]}")
    assert loaded, "no preempted request was reloaded from kvbm"
