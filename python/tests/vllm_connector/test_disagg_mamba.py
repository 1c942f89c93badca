"""Disaggregated prefill->decode of a Mamba / linear-attention hybrid (vLLM
0.33 and 0.34, hybrid KV cache manager on, Mamba align mode;
mamba_harness.py) in NixlConnector's convention: the prefill stops one
prompt token short (its state is h(N-1)), sends its attention blocks and
its Mamba state slot; the decode loads N-1 prompt tokens, the state into
the block vLLM's align mode reads h(N-1) from, and computes the last
prompt token itself (pd_groups.py)."""
import json
import time

from harness import require_vllm

require_vllm()

import pytest  # noqa: E402

from harness import BLOCK, Engine, on_a_free_port  # noqa: E402
from mamba_harness import MambaEngine  # noqa: E402
from test_disagg import free_port, run_both  # noqa: E402
from test_disagg_hybrid import _refused  # noqa: E402

#: Prompts whose N-1 tokens end inside a block, at a block's end, and
#: whose N does (the decode's last token then starts a block, or not).
PROMPTS = {"partial": list(range(300, 300 + 5 * BLOCK + 5)),
           "whole": list(range(300, 300 + 5 * BLOCK + 1)),
           "block-end": list(range(300, 300 + 5 * BLOCK))}
PROMPT = PROMPTS["partial"]


def cdiv(a, b):
    return -(-a // b)


def prefill_engine(role="kv_producer", **kw):
    return on_a_free_port(lambda port: MambaEngine(
        {"g2_blocks": 8, "pd_port": port}, role=role,
        engine_id="prefill-engine", **kw))


def decode_engine(policy="fail", role="kv_consumer", timeout_s=10.0, **kw):
    return MambaEngine({"g2_blocks": 8, "pd_timeout_s": timeout_s}, role=role,
                       engine_id="decode-engine", policy=policy, **kw)


def snapshot(e, b, g):
    """The bytes of G1 block b in group g's layers (its state, for Mamba)."""
    read = e.read_state if e.kinds[g] == "mamba" else e.read_kv
    return [read(b, layer) for layer in e.group_layers[g]]


def prefill(p, req_id="R", prompt=PROMPT):
    """Runs req_id's prefill; returns its kv_transfer_params, its tables at
    its last step, the sent blocks' bytes per group, and the request."""
    r = p.add(req_id, prompt, max_tokens=5, kv_transfer_params={"do_remote_decode": True})
    tables = {}

    def keep(so):
        if req_id in p.sched.requests:
            tables["t"] = p.tables(req_id)
    deadline = time.monotonic() + 10
    while req_id not in p.finished:
        assert time.monotonic() < deadline
        p.step(keep)
    params = p.finished[req_id].kv_transfer_params
    assert params is not None, "the prefill returned no kv_transfer_params"
    want = [[snapshot(p, b, g) for b in ids] for g, ids in enumerate(params["remote_block_ids"])]
    return params, tables["t"], want, r


@pytest.fixture
def pd(request):
    role = getattr(request, "param", None)
    p, d = (prefill_engine(), decode_engine()) if role is None else (
        prefill_engine(role=role), decode_engine(role=role))
    yield p, d
    d.close()
    p.close()


@pytest.mark.parametrize("which", sorted(PROMPTS))
def test_the_prefill_stops_one_token_short_and_sends_its_state_slot(pd, which):
    p, _ = pd
    prompt = PROMPTS[which]
    n = len(prompt) - 1
    params, tables, _, r = prefill(p, prompt=prompt)
    # Truncated as NixlConnector's: one token sampled after N-1 prompt tokens.
    assert r.num_prompt_tokens == n and list(r.prompt_token_ids) == prompt[:-1]
    assert r.max_tokens == 1 and len(r.output_token_ids) == 1
    assert params["remote_num_tokens"] == n and r.kv_transfer_params["_p_side_truncated"]
    ids = params["remote_block_ids"]
    assert ids[0] == tables[0] and len(ids[0]) == cdiv(n, BLOCK)
    # The state slot: the block the prefill's forward wrote h(N-1) into.
    assert ids[1] == [tables[1][cdiv(n, BLOCK) - 1]] == [p.states[("R", n)]]
    assert p.holds_state(r, tables[1], n, 1)
    assert params["kvbm_groups"] == [
        {"group": 0, "kind": "full", "block_size": BLOCK},
        {"group": 1, "kind": "mamba", "block_size": BLOCK}]
    p.step()
    held = p.worker._worker._server._held["R"].blocks
    assert sorted(held) == sorted(set(ids[0]) | set(ids[1]))
    # Added again (a preemption): not truncated twice.
    p.sched.connector.on_new_request(r)
    assert r.num_prompt_tokens == n


@pytest.mark.parametrize("pd", [None, "kv_both"], indirect=True,
                         ids=["producer-consumer", "kv_both"])
@pytest.mark.parametrize("which", sorted(PROMPTS))
@pytest.mark.parametrize("wire", ["python", "json"])
def test_the_decode_loads_n_minus_1_tokens_and_computes_the_last(pd, which, wire):
    p, d = pd
    prompt = PROMPTS[which]
    n = len(prompt) - 1
    params, _, want, _ = prefill(p, prompt=prompt)
    if wire == "json":  # as an HTTP proxy passes it on
        params = json.loads(json.dumps(params))
    r = d.add("R-decode", prompt, max_tokens=4, kv_transfer_params=params)
    assert d.sched.connector.get_num_new_matched_tokens(r, 0) == (n, True)
    d.verify = True  # before every forward: each attention block and the state read right
    seen = {"pulls": []}

    def grab(so):
        seen["pulls"].extend(x for x in so.kv_connector_metadata.pulls if x.block_ids)
        if "R-decode" in so.num_scheduled_tokens and "tables" not in seen:
            seen["tables"] = tables = d.tables("R-decode")
            seen["start"] = d.spans(so)["R-decode"]
            for g, ids in enumerate(params["remote_block_ids"]):
                if d.kinds[g] == "mamba":  # h(N-1) where align mode reads it
                    b = d.state_block(tables[g], n)
                    got = snapshot(d, b, g)
                    assert got and all((x == y).all() for x, y in zip(got, want[g][0]))
                    assert d.holds_state(r, tables[g], n, g)
                    continue
                for i, got in enumerate(want[g]):
                    for x, y in zip(snapshot(d, tables[g][i], g), got):
                        assert (x == y).all(), f"group {g} block {i}"
                    assert i >= n // BLOCK or d.holds_kv(r, tables[g], i, g)
    run_both(p, d, before_forward=grab)
    assert seen["start"] == (n, n + 1)  # the last prompt token, computed here
    (pull,) = seen["pulls"]
    tables = seen["tables"]
    state = d.state_block(tables[1], n)
    assert sorted(pull.block_ids) == sorted(tables[0][:cdiv(n, BLOCK)] + [state])
    assert sorted(pull.remote_block_ids) == sorted(
        b for ids in params["remote_block_ids"] for b in ids)
    # The tokens after it: each step's state came from the one before (verify).
    assert ("R-decode", n + 4) in d.states or ("R-decode", n + 3) in d.states
    assert d.finished["R-decode"].finish_reason.name == "LENGTH"
    assert [o.finished_recving for o in d.outputs if o.finished_recving] == [{"R-decode"}]
    assert not any(o.failed_recving for o in d.outputs)
    assert [o.finished_sending for o in p.outputs if o.finished_sending] == [{"R"}]


def test_a_local_hit_shortens_the_pull(pd):
    """The decode's own prefix cache holds the first blocks (and the state
    after them): the pull takes the attention blocks after them and the
    state slot for N-1 tokens."""
    p, d = pd
    n = len(PROMPT) - 1
    params, _, _, _ = prefill(p)
    d.add("L", PROMPT[:3 * BLOCK] + [9] * 3)
    d.run()
    d.verify = True
    pulls, seen = [], {}

    def grab(so):
        pulls.extend(x for x in so.kv_connector_metadata.pulls if x.block_ids)
        if "R-decode" in so.num_scheduled_tokens and "start" not in seen:
            seen["start"] = d.spans(so)["R-decode"]
            seen["tables"] = d.tables("R-decode")
    r = d.add("R-decode", PROMPT, max_tokens=2, kv_transfer_params=params)
    run_both(p, d, before_forward=grab)
    (pull,) = pulls
    tables = seen["tables"]
    hit = min(i for i, b in enumerate(tables[0]) if b in pull.block_ids)
    assert hit >= 1, "the decode's prefix cache served nothing"
    assert sorted(pull.block_ids) == sorted(tables[0][hit:cdiv(n, BLOCK)] +
                                            [d.state_block(tables[1], n)])
    assert seen["start"] == (n, n + 1)
    assert d.finished["R-decode"].finish_reason.name == "LENGTH"
    assert not any(o.failed_recving for o in d.outputs)
    assert r.num_prompt_tokens == len(PROMPT)


def test_a_decode_without_mamba_refuses_a_mamba_prefill(caplog):
    p = prefill_engine()
    d = Engine({"g2_blocks": 8, "pd_timeout_s": 10.0}, role="kv_consumer",
               engine_id="decode-engine", policy="fail")
    try:
        params, _, _, _ = prefill(p)
        msg = _refused(p, d, caplog, params)
        assert "group 1 mamba" in msg and "this decode's one group" in msg
    finally:
        d.close()
        p.close()


def test_a_mamba_decode_refuses_a_prefill_without_mamba(caplog):
    from test_disagg import prefill as single_prefill
    p = Engine({"g2_blocks": 8, "pd_port": free_port()}, role="kv_producer",
               engine_id="prefill-engine")
    d = decode_engine()
    try:
        _, params, _ = single_prefill(p, prompt=PROMPT)
        # The prefill without Mamba computed the whole prompt (no backoff).
        assert params["remote_num_tokens"] == len(PROMPT)
        msg = _refused(p, d, caplog, params)
        assert "one group (a flat remote_block_ids)" in msg and "group 1 mamba" in msg
    finally:
        d.close()
        p.close()


def test_a_mamba_hybrid_between_tp_sizes_is_refused(caplog):
    """A prefill of another tensor-parallel size (its kv_transfer_params say
    tp_size 2, as a TP-2 prefill's do): a Mamba state is not head-sliced,
    so the decode refuses at the request, naming both sizes and the Mamba
    group; nothing is loaded; the request fails through failed_recving; the
    prefill's rank this decode answers for lets go."""
    import logging
    p, d = prefill_engine(), decode_engine(timeout_s=2.0)
    try:
        params, _, _, _ = prefill(p)
        params = dict(params, tp_size=2)
        d.add("R-decode", PROMPT, max_tokens=3, kv_transfer_params=params)
        with caplog.at_level(logging.ERROR, logger="kvbmgo"):
            run_both(p, d)
        assert [o.failed_recving for o in d.outputs if o.failed_recving] == [{"R-decode"}]
        assert not set().union(*(o.invalid_block_ids for o in d.outputs))
        assert d.finished["R-decode"].finish_reason.name == "ERROR"
        assert not d.raw.any(), "the decode loaded something"
        assert [o.finished_sending for o in p.outputs if o.finished_sending] == [{"R"}]
        (msg,) = [r.getMessage() for r in caplog.records if "Mamba group" in r.getMessage()]
        assert "tensor-parallel size 2, this decode 1" in msg and "group 1" in msg
        assert not [r for r in caplog.records if "describe its KV heads" in r.getMessage()]
    finally:
        d.close()
        p.close()


def test_a_failed_pull_goes_through_failed_recving():
    """A dead prefill: the pull fails within its deadline, the request is
    reported failed (failed_recving) and, with recompute, computed here
    from its first token, its state included."""
    p, d = prefill_engine(), decode_engine(timeout_s=1.5, policy="recompute")
    try:
        params, _, _, _ = prefill(p)
        p.close()
        d.verify = True
        d.add("R-decode", PROMPT, max_tokens=2, kv_transfer_params=params)
        d.run(timeout=20)
        assert [o.failed_recving for o in d.outputs if o.failed_recving] == [{"R-decode"}]
        assert not set().union(*(o.invalid_block_ids for o in d.outputs))
        assert d.finished["R-decode"].finish_reason.name == "LENGTH"
        assert ("R-decode", len(PROMPT)) in d.states
    finally:
        d.close()


def test_the_backoff_follows_nixl():
    from kvbmgo.vllm import pd_groups
    from kvbmgo.vllm.groups import KvGroup, KvGroups
    mamba = KvGroups((KvGroup(0, "full", BLOCK, 0), KvGroup(1, "mamba", BLOCK, 0)), 2, BLOCK)
    window = KvGroups((KvGroup(0, "full", BLOCK, 0), KvGroup(1, "window", BLOCK, 32)), 2,
                      BLOCK)
    assert pd_groups.backoff(mamba) == 1 and pd_groups.backoff(window) == 0
    assert [pd_groups.remote_tokens(mamba, n) for n in (0, 1, 2, 81)] == [0, 1, 1, 80]
    assert pd_groups.remote_tokens(window, 81) == 81
    # The decode's state block is its entry for N-1 tokens.
    params = {"remote_block_ids": [[1, 2, 3], [7]], "kvbm_groups": pd_groups.layout(mamba),
              "remote_num_tokens": 2 * BLOCK + 3}
    assert pd_groups.pairs(mamba, params, ([4, 5, 6], [0, 0, 9]), 0, 2 * BLOCK + 3) == \
        ([1, 2, 3, 7], [4, 5, 6, 9], "")
    assert pd_groups.pairs(mamba, dict(params, remote_block_ids=[[1, 2, 3], []]),
                           ([4, 5, 6], [0, 0, 9]), 0, 2 * BLOCK + 3)[2] == \
        "the prefill sent no state for group 1"


@pytest.mark.parametrize("which", sorted(PROMPTS))
def test_truncation_drops_the_hashes_the_last_token_filled(which):
    """On vLLM's own Request, 0.34's truncate_block_hashes or 0.33's
    hashes: a block the dropped token ended is no longer hashed; once only."""
    from harness import Request, SamplingParams, sha256, get_request_block_hasher, EOS
    from kvbmgo.vllm import pd_groups
    from kvbmgo.vllm.groups import KvGroup, KvGroups
    groups = KvGroups((KvGroup(0, "full", BLOCK, 0), KvGroup(1, "mamba", BLOCK, 0)), 2, BLOCK)
    prompt = PROMPTS[which]
    sp = SamplingParams(max_tokens=9, ignore_eos=True,
                        extra_args={"kv_transfer_params": {"do_remote_decode": True}})
    sp.update_from_generation_config({}, EOS)
    r = Request(request_id="T", prompt_token_ids=list(prompt), sampling_params=sp,
                pooling_params=None, block_hasher=get_request_block_hasher(BLOCK, sha256))
    before = list(r.block_hashes)
    assert len(before) == len(prompt) // BLOCK
    assert pd_groups.truncate_for_prefill(groups, r)
    assert r.num_prompt_tokens == r.num_tokens == len(prompt) - 1 and r.max_tokens == 1
    assert list(r.block_hashes) == before[:(len(prompt) - 1) // BLOCK]
    assert not pd_groups.truncate_for_prefill(groups, r)
    assert r.num_tokens == len(prompt) - 1
