"""P/D of a hybrid model (full attention + sliding window, vLLM's hybrid KV
cache manager on) between tensor-parallel sizes, with the real vLLM
scheduler (0.33 and 0.34) and one worker connector per rank (tp_engine.py,
window=): each group's blocks go over as NixlConnector's HMA convention
names them (one list per group, the window clipped to its tail), each
decode rank's heads gathered from several prefill ranks (p > d) or sliced
out of one (p < d). Every byte of every group's pulled blocks is checked on
every decode rank; the window's out-of-window blocks are never pulled."""
from harness import require_vllm

require_vllm()

import pytest  # noqa: E402
import torch  # noqa: E402

from harness import BLOCK  # noqa: E402
from test_disagg_hybrid import pulled_into  # noqa: E402
from test_disagg_tp import free_port  # noqa: E402
from tp_engine import TpEngine, model_dir, rank_heads, run_both  # noqa: E402

WINDOW = 2 * BLOCK
#: 5 full blocks and 5 tokens: the window (2 blocks) keeps the last 3.
PROMPT = list(range(300, 300 + 5 * BLOCK + 5))
#: What a window group sends: NixlConnector's cdiv(window, block_size) + 1.
TAIL = -(-WINDOW // BLOCK) + 1
NULL = 0


def engines(model, p, d, *, p_layout="LBNHC", d_layout="LBNHC"):
    pe = TpEngine(model, p, {"g2_blocks": 8, "pd_port": free_port(p)}, role="kv_producer",
                  engine_id="prefill-hybrid-tp", layout=p_layout, window=WINDOW)
    de = TpEngine(model, d, {"g2_blocks": 8, "pd_timeout_s": 10.0}, role="kv_consumer",
                  engine_id="decode-hybrid-tp", layout=d_layout, window=WINDOW)
    return pe, de


def prefill(pe):
    """Runs the prefill; returns its kv_transfer_params and, per group, each
    sent block's global KV per layer of the group (None for a null id)."""
    pe.add("R", PROMPT, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    for _ in range(1000):
        if "R" in pe.finished:
            break
        pe.step()
    params = pe.finished["R"].kv_transfer_params
    assert params is not None and params["tp_size"] == pe.tp
    ids = params["remote_block_ids"]
    assert len(ids) == 2 and len(ids[0]) == 6 and len(ids[1]) == TAIL and NULL not in ids[1]
    want = [[None if b == NULL else [pe.assembled(b, layer) for layer in layers]
             for b in lst] for lst, layers in zip(ids, pe.group_layers)]
    return params, want


@pytest.mark.parametrize("kv_heads,p,d,p_layout,d_layout", [
    (2, 2, 1, "LBNHC", "LBNHC"),   # gather: 2 prefill ranks fill 1 decode rank
    (2, 1, 2, "LBHNC", "LBNHC"),   # slice: 2 decode ranks read 1 prefill rank (HND into NHD)
    (4, 4, 2, "LBNHC", "LBHNC"),   # gather, 4 heads
], ids=["p2-d1", "p1-d2", "p4-d2"])
def test_every_group_between_tp_sizes_byte_for_byte(tmp_path, kv_heads, p, d, p_layout,
                                                     d_layout):
    pe, de = engines(model_dir(tmp_path, kv_heads), p, d, p_layout=p_layout, d_layout=d_layout)
    try:
        params, want = prefill(pe)
        de.add("R-decode", PROMPT, max_tokens=2, kv_transfer_params=params)
        seen = {}

        def check(so):
            seen.setdefault("pulls", []).extend(so.kv_connector_metadata.pulls)
            if "R-decode" not in so.num_scheduled_tokens or "tables" in seen:
                return
            seen["tables"] = tables = de.tables("R-decode")
            seen["scheduled"] = so.num_scheduled_tokens["R-decode"]
            written = set()
            for g, pos, b, got in pulled_into(tables, params["remote_block_ids"], want):
                written.add(b)
                for r in range(de.tp):
                    heads = rank_heads(r, de.tp, de.total, False)
                    for layer, w in zip(de.group_layers[g], got):
                        assert torch.equal(de.read(r, b, layer), w[heads]), \
                            (f"decode rank {r} group {g} block {pos} (G1 {b}) layer {layer}: "
                             f"heads {heads}")
            for r in range(de.tp):
                for b in range(de.kvc.num_blocks):
                    if b not in written:
                        for layer in range(len(de.layers)):
                            assert not de.read(r, b, layer).any(), \
                                f"decode rank {r} block {b} was written"
            seen["written"] = written

        run_both(pe, de, before_forward=check)
        assert seen["scheduled"] == 1  # all prompt tokens but the last came from the prefill
        tables = seen["tables"]
        # The window: the decode's out-of-window entries are null and never
        # pulled; its kept ones, at most the sent tail, all were.
        window = [b for b in tables[1] if b != NULL]
        assert tables[1][0] == NULL and len(window) <= TAIL
        assert set(window) <= seen["written"]
        (pull,) = [x for x in seen["pulls"] if x.block_ids]
        assert len(pull.block_ids) == len(tables[0]) + len(window)
        assert de.finished["R-decode"].finish_reason.name == "LENGTH"
        assert [o.finished_recving for o in de.outputs if o.finished_recving] == [{"R-decode"}]
        assert not any(o.failed_recving for o in de.outputs)
        assert not set().union(*(o.invalid_block_ids or () for o in de.outputs))
        # Every prefill rank let go once every decode rank reading it was done.
        assert [o.finished_sending for o in pe.outputs if o.finished_sending] == [{"R"}]
        assert not pe.sched.requests and not de.sched.requests
    finally:
        de.close()
        pe.close()
