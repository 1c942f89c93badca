"""Disaggregated prefill->decode of the sliding-window hybrid model
(e2e_common/hybrid_model.py, Gemma 3 text) between tensor-parallel sizes
in real vLLM engines with HMA on: a prefill at TP 2 (a process per rank,
each half the KV heads) and a decode at TP 1, which gathers each block's
heads from both prefill ranks, per KV cache group (the window's tail only);
and a prefill at TP 1 whose blocks two decode ranks each take their half
of. Tokens equal a single engine's, and every head of every pulled block,
over its group's layers, is the one the prefill held."""
import pytest

from e2e_helpers import SWA_G1_BLOCKS, SWA_PAGE_BYTES, Engine, free_port, prompt, records


def _engine(model_dir, role, tp):
    return Engine(model_dir, {"g2_blocks": 32, "pd_port": free_port()}, role=role,
                  kv_bytes=SWA_G1_BLOCKS * SWA_PAGE_BYTES // tp,
                  name=f"swa-{role[3:]}-tp{tp}", tp=tp)


@pytest.fixture(scope="module", params=[(2, 1), (1, 2)], ids=["p2-d1", "p1-d2"])
def pd(swa_model_dir, request):
    """(prefill, decode, decode's TP size): the prefill at TP p, the decode at d."""
    p_tp, d_tp = request.param
    p = _engine(swa_model_dir, "kv_producer", p_tp)
    try:
        d = _engine(swa_model_dir, "kv_consumer", d_tp)
    except BaseException:
        p.close()
        raise
    yield p, d, d_tp
    d.close()
    p.close()


def test_every_groups_heads_between_tp_sizes(pd, swa_baseline):
    prefill, decode, d_tp = pd
    groups = prefill.call("groups")["groups"]
    ps = [prompt(40), prompt(41, 200)]
    out = prefill.generate(ps, 1, kv_transfer_params=[{"do_remote_decode": True}] * len(ps))
    params = out["kv_transfer_params"]
    for p in params:
        assert p and p.get("do_remote_prefill") and p.get("tp_size"), params
        assert len(p["remote_block_ids"]) == len(groups) == len(p["kvbm_groups"]), p
    window = next(i for i, g in enumerate(groups) if g["spec"] == "SlidingWindowSpec")
    prefill.call("step", n=2)  # the prefill holds them now (a server keeps stepping)
    # Every head of every block the prefill sent (its ranks' in rank order),
    # over its group's layers.
    want = {}
    for p in params:
        for g, ids in enumerate(p["remote_block_ids"]):
            ids = [b for b in ids if b]
            per_rank = prefill.call("digests", block_ids=[ids], group=g, heads=True)["digests"]
            for i, b in enumerate(ids):
                want[(g, b)] = [h for rank in per_rank for h in rank[0][i]]
    got = decode.generate(ps, 8, kv_transfer_params=params)
    assert got["tokens"] == swa_baseline(ps, 8)
    pulled = records(got, "pulled")
    assert len(pulled) == len(ps) * d_tp, got["records"]
    checked = {g: 0 for g in range(len(groups))}
    for r in pulled:
        assert r["failed"] == 0, r
        assert len(r["remote_block_ids"]) == len(r["block_ids"]) > 0, r
        p = next(p for p in params if set(r["remote_block_ids"]) <= {
            b for ids in p["remote_block_ids"] for b in ids})
        for i, rb in enumerate(r["remote_block_ids"]):
            g = next(g for g, ids in enumerate(p["remote_block_ids"]) if rb in ids)
            # Decode rank r holds global heads r*n .. r*n+n-1.
            mine = r["head_digests"][str(g)][i]
            n = len(mine)
            assert mine == want[(g, rb)][r["rank"] * n:(r["rank"] + 1) * n], (g, rb, r)
            checked[g] += 1
    assert checked[window] > 0 and checked[1 - window] > 0, checked
    print(f"hybrid P/D to TP {d_tp}: {checked} blocks per group pulled, "
          f"every head equal")
