"""Disaggregated prefill->decode with vLLM's hybrid KV cache manager (0.33
and 0.34): a full-attention + sliding-window prefill engine and decode
engine (hybrid_harness.py) hand a request over in NixlConnector's HMA
convention (remote_block_ids one list per group, a window clipped to its
in-window tail), every group's bytes checked on the decode; a decode whose
groups differ from the prefill's refuses, failing the request through
failed_recving with nothing loaded (pd_groups.py)."""
import json
import logging
import time

from harness import require_vllm

require_vllm()

import pytest  # noqa: E402
import torch  # noqa: E402

from harness import BLOCK, Engine, on_a_free_port  # noqa: E402
from hybrid_harness import GROUP_LAYERS, LAYERS, NULL, WINDOW, HybridEngine  # noqa: E402
from test_disagg import free_port, run_both  # noqa: E402

#: 5 full blocks and 5 tokens: the window (2 blocks) keeps the last 3.
PROMPT = list(range(300, 300 + 5 * BLOCK + 5))
#: What a window group sends: NixlConnector's cdiv(window, block_size) + 1.
TAIL = -(-WINDOW // BLOCK) + 1


def prefill_engine(role="kv_producer", **kw):
    return on_a_free_port(lambda port: HybridEngine({"g2_blocks": 8, "pd_port": port}, role=role,
                                                    engine_id="prefill-engine", **kw))


def decode_engine(policy="fail", role="kv_consumer", timeout_s=10.0, **kw):
    return HybridEngine({"g2_blocks": 8, "pd_timeout_s": timeout_s}, role=role,
                        engine_id="decode-engine", policy=policy, **kw)


def snapshot(e, ids, group):
    """The bytes of G1 blocks ids in group's layers (None for a null id)."""
    return [None if b == NULL else [e.read(b, layer) for layer in GROUP_LAYERS[group]]
            for b in ids]


def prefill(p, req_id="R", prompt=PROMPT):
    """Runs req_id's prefill; returns its kv_transfer_params, its block
    tables as they were at its last step, and each group's sent blocks' bytes."""
    p.add(req_id, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
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
    want = [snapshot(p, ids, g) for g, ids in enumerate(params["remote_block_ids"])]
    return params, tables["t"], want


def pulled_into(tables, remote_lists, want):
    """(group, position, decode G1 block, the prefill's bytes) of each sent
    block the decode holds: a group's list lines up with the decode's table
    of that group from the tail; null ids on either side are skipped."""
    for g, ids in enumerate(remote_lists):
        n = len(tables[g])
        for i, got in enumerate(want[g]):
            b = tables[g][n - len(ids) + i]
            if b != NULL and got is not None:
                yield g, n - len(ids) + i, b, got


@pytest.fixture
def pd(request):
    role = getattr(request, "param", None)
    p, d = (prefill_engine(), decode_engine()) if role is None else (
        prefill_engine(role=role), decode_engine(role=role))
    yield p, d
    d.close()
    p.close()


def test_params_name_each_groups_blocks_clipped_as_nixl(pd):
    p, _ = pd
    params, tables, _ = prefill(p)
    ids = params["remote_block_ids"]
    assert isinstance(ids, tuple) and len(ids) == 2
    assert ids[0] == tables[0] and len(ids[0]) == 6
    # The window: its in-window tail only, out-of-window entries never named.
    assert ids[1] == tables[1][-TAIL:] and len(tables[1]) == 6
    assert NULL not in ids[1]
    assert params["kvbm_groups"] == [
        {"group": 0, "kind": "full", "block_size": BLOCK},
        {"group": 1, "kind": "window", "block_size": BLOCK, "window": WINDOW}]
    assert params["do_remote_prefill"] is True and params["remote_num_tokens"] == len(PROMPT)
    # Held for the decode: the blocks stay allocated after the request finished.
    assert "R" in p.sched.requests
    # The prefill's worker holds exactly the blocks named, once each.
    p.step()
    held = p.worker._worker._server._held["R"].blocks
    assert sorted(held) == sorted(set(ids[0]) | set(ids[1]))


@pytest.mark.parametrize("pd", [None, "kv_both"], indirect=True,
                         ids=["producer-consumer", "kv_both"])
@pytest.mark.parametrize("wire", ["python", "json"])
def test_every_group_is_handed_over_byte_for_byte(pd, wire):
    p, d = pd
    params, _, want = prefill(p)
    if wire == "json":  # as an HTTP proxy passes it on: the tuple is a list
        params = json.loads(json.dumps(params))
    d.add("R-decode", PROMPT, max_tokens=3, kv_transfer_params=params)
    d.verify = True  # every computed block the decode keeps holds its KV
    seen = {}

    def grab(so):
        seen.setdefault("pulls", []).extend(so.kv_connector_metadata.pulls)
        if "R-decode" in so.num_scheduled_tokens and "tables" not in seen:
            seen["tables"] = tables = d.tables("R-decode")
            seen["scheduled"] = so.num_scheduled_tokens["R-decode"]
            written = set()
            for g, pos, b, got in pulled_into(tables, params["remote_block_ids"], want):
                written.add(b)
                for layer, w in zip(GROUP_LAYERS[g], got):
                    assert torch.equal(d.read(b, layer), w), \
                        f"group {g} block {pos} (decode G1 {b}) layer {layer}"
            # Guard: every other decode block was not written, in any layer.
            for b in range(d.kvc.num_blocks):
                if b not in written:
                    for layer in range(len(LAYERS)):
                        assert not d.read(b, layer).any(), f"decode block {b} was written"
            seen["written"] = written
    run_both(p, d, before_forward=grab)
    assert seen["scheduled"] == 1  # all prompt tokens but the last came from the prefill
    (pull,) = [x for x in seen["pulls"] if x.block_ids]
    tables = seen["tables"]
    # Out-of-window blocks are never pulled: the window's pairs are its
    # kept (not null) blocks on the decode, no more.
    window = [b for b in tables[1] if b != NULL]
    assert len(window) <= TAIL and set(window) <= seen["written"]
    assert len(pull.block_ids) == len(tables[0]) + len(window)
    assert sorted(pull.remote_block_ids) == sorted(
        b for ids in params["remote_block_ids"] for b in ids if b != NULL)
    assert d.finished["R-decode"].finish_reason.name == "LENGTH"
    assert [o.finished_recving for o in d.outputs if o.finished_recving] == [{"R-decode"}]
    assert not any(o.failed_recving for o in d.outputs)
    assert not set().union(*(o.invalid_block_ids for o in d.outputs))
    assert [o.finished_sending for o in p.outputs if o.finished_sending] == [{"R"}]
    assert p.sched.kv_cache_manager.block_pool.get_num_free_blocks() == p.kvc.num_blocks - 1


def test_a_local_hit_shortens_the_pull_to_the_blocks_after_it(pd):
    """The decode's own prefix cache holds the first blocks: it pulls each
    group's blocks after them only, from the same positions of the
    prefill's, and every block it keeps holds its KV."""
    p, d = pd
    params, _, _ = prefill(p)
    d.add("L", PROMPT[:3 * BLOCK] + [9] * 3)
    d.run()
    d.verify = True
    pulls = []
    seen = {}

    def grab(so):
        pulls.extend(x for x in so.kv_connector_metadata.pulls if x.block_ids)
        if "R-decode" in so.num_scheduled_tokens and "n" not in seen:
            seen["n"] = so.num_scheduled_tokens["R-decode"]
            seen["tables"] = d.tables("R-decode")
    d.add("R-decode", PROMPT, max_tokens=2, kv_transfer_params=params)
    run_both(p, d, before_forward=grab)
    (pull,) = pulls
    tables = seen["tables"]
    hit = min(i for i, b in enumerate(tables[0]) if b in pull.block_ids)
    assert hit >= 1, "the decode's prefix cache served nothing"
    want = [b for b in tables[0][hit:]] + [b for b in tables[1][hit:] if b != NULL]
    assert sorted(pull.block_ids) == sorted(want)
    assert not set(pull.block_ids) & set(tables[0][:hit])
    assert seen["n"] == 1
    assert d.finished["R-decode"].finish_reason.name == "LENGTH"
    assert not any(o.failed_recving for o in d.outputs)


def _refused(p, d, caplog, params, prompt=PROMPT):
    """Runs a decode request that d must refuse: it fails through
    failed_recving, nothing is written, the prefill lets go. Returns the
    error logged."""
    d.add("R-decode", prompt, max_tokens=3, kv_transfer_params=params)
    with caplog.at_level(logging.ERROR, logger="kvbmgo"):
        run_both(p, d)
    assert [o.failed_recving for o in d.outputs if o.failed_recving] == [{"R-decode"}]
    assert not set().union(*(o.invalid_block_ids for o in d.outputs))
    assert d.finished["R-decode"].finish_reason.name == "ERROR"
    raw = d.raw if hasattr(d, "raw") else None
    assert raw is None or not raw.any(), "the decode loaded something"
    assert [o.finished_sending for o in p.outputs if o.finished_sending] == [{"R"}]
    (msg,) = [r.getMessage() for r in caplog.records if "P/D needs the same groups" in
              r.getMessage()]
    return msg


def test_a_single_group_decode_refuses_a_hybrid_prefill(caplog):
    p = prefill_engine()
    d = Engine({"g2_blocks": 8, "pd_timeout_s": 10.0}, role="kv_consumer",
               engine_id="decode-engine", policy="fail")
    try:
        params, _, _ = prefill(p)
        msg = _refused(p, d, caplog, params)
        assert "group 1 window" in msg and "this decode's one group" in msg
    finally:
        d.close()
        p.close()


def test_a_hybrid_decode_refuses_a_single_group_prefill(caplog):
    from test_disagg import prefill as single_prefill
    p = Engine({"g2_blocks": 8, "pd_port": free_port()}, role="kv_producer",
               engine_id="prefill-engine")
    d = decode_engine()
    try:
        _, params, _ = single_prefill(p, prompt=PROMPT)
        msg = _refused(p, d, caplog, params)
        assert "one group (a flat remote_block_ids)" in msg and "group 1 window" in msg
    finally:
        d.close()
        p.close()


def test_a_decode_refuses_other_group_layouts(pd, caplog):
    """Groups that differ in a window (another model, or another config):
    refused, naming both."""
    p, d = pd
    params, _, _ = prefill(p)
    params["kvbm_groups"] = [dict(g) for g in params["kvbm_groups"]]
    params["kvbm_groups"][1]["window"] = 4 * WINDOW
    msg = _refused(p, d, caplog, params)
    assert f"window {4 * WINDOW} tokens" in msg and f"window {WINDOW} tokens" in msg


def test_a_failed_pull_fails_the_request_not_its_blocks():
    """A dead prefill: the pull fails within its deadline, reported as the
    request's (failed_recving): vLLM raises on block ids with several groups."""
    p, d = prefill_engine(), decode_engine(timeout_s=1.5, policy="recompute")
    try:
        params, _, _ = prefill(p)
        p.close()
        d.add("R-decode", PROMPT, max_tokens=2, kv_transfer_params=params)
        d.run(timeout=20)
        assert [o.failed_recving for o in d.outputs if o.failed_recving] == [{"R-decode"}]
        assert not set().union(*(o.invalid_block_ids for o in d.outputs))
        # recompute: computed here from its first token
        assert d.finished["R-decode"].finish_reason.name == "LENGTH"
    finally:
        d.close()


# ---- the wire format alone (pd_groups.py)

def _groups(*kinds):
    from kvbmgo.vllm.groups import KvGroup, KvGroups
    kept = tuple(KvGroup(i, k, BLOCK, WINDOW if k == "window" else 0)
                 for i, k in enumerate(kinds))
    return KvGroups(kept, len(kept), BLOCK)


def test_a_mamba_group_sends_its_state_slot_only():
    """The place of a Mamba group (kind "mamba", once kvbm keeps its state):
    NixlConnector's clip_ssm_state_blocks, one block, paired with the
    decode's own state slot."""
    from kvbmgo.vllm import pd_groups
    g = _groups("full", "mamba")
    lists, held = pd_groups.sent(g, ([1, 2, 3], [0, 0, 7]))
    assert lists == ([1, 2, 3], [7]) and held == [1, 2, 3, 7]
    params = {"remote_block_ids": json.loads(json.dumps(lists)),
              "kvbm_groups": pd_groups.layout(g), "remote_num_tokens": 3 * BLOCK}
    assert pd_groups.pairs(g, params, ([4, 5, 6], [0, 0, 9]), 0, 3 * BLOCK) == \
        ([1, 2, 3, 7], [4, 5, 6, 9], "")


def test_the_decode_pairs_from_the_tail_and_refuses_what_it_cannot_pair():
    from kvbmgo.vllm import pd_groups
    g = _groups("full", "window")
    lay = pd_groups.layout(g)
    p = {"remote_block_ids": [[1, 2, 3, 4, 5, 6], [8, 11, 12]], "kvbm_groups": lay,
         "remote_num_tokens": 5 * BLOCK + 5}
    # A local GPU hit of 2 blocks: the rest pulled; the window's null
    # (out-of-window) positions skipped.
    remote, local, why = pd_groups.pairs(g, p, ([21, 22, 23, 24, 25, 26],
                                                [0, 0, 0, 37, 38, 39]), 2, 3 * BLOCK + 5)
    assert why == "" and remote == [3, 4, 5, 6, 8, 11, 12] and \
        local == [23, 24, 25, 26, 37, 38, 39]
    # A full group's list shorter than the decode needs: refused.
    short = dict(p, remote_block_ids=[[1, 2], [8, 11, 12]])
    assert "did not send block" in pd_groups.pairs(g, short, ([1] * 6, [1] * 6), 0,
                                                   5 * BLOCK + 5)[2]
    for bad in ([[1, 2]], [[1], ["x"]], "12", [[1, 2], [3], [4]]):
        assert pd_groups.pairs(g, dict(p, remote_block_ids=bad), ([1] * 6, [1] * 6), 0,
                               5 * BLOCK + 5)[2]
    # One group: flat, or NixlConnector's list of one list.
    one = _groups("full")
    one = type(one)(one.kept, 1, BLOCK)
    for ids in ([1, 2, 3], [[1, 2, 3]]):
        assert pd_groups.pairs(one, {"remote_block_ids": ids}, ([4, 5, 6],), 1, 2 * BLOCK) \
            == ([2, 3], [5, 6], "")


def test_groups_with_other_heads_pull_between_equal_tp_sizes_only(caplog):
    """A head slice is planned from the first group's views: groups whose
    views hold other head counts turn P/D between TP sizes off (said), not
    slice a window group's blocks wrong."""
    with caplog.at_level(logging.WARNING, logger="kvbmgo"):
        other = HybridEngine({"g2_blocks": 8}, window_heads=1)
        same = HybridEngine({"g2_blocks": 8})
    try:
        assert other.worker._worker._local is None
        assert same.worker._worker._local is not None
        assert any("heads per block" in r.getMessage() for r in caplog.records)
    finally:
        other.close()
        same.close()
