"""Disaggregated prefill->decode of the sliding-window hybrid model
(e2e_common/hybrid_model.py) between two real vLLM engine processes with
HMA on: the prefill's kv_transfer_params carry one list of blocks per KV
cache group (NixlConnector's convention: the window group's in-window tail
only), the decode pulls each group's blocks into its own per-group ids, its
tokens equal a single engine's, and every pulled block holds, over its
group's layers, the prefill's bytes."""
import pytest

from e2e_helpers import free_port, prompt, records, swa_engine


@pytest.fixture(scope="module")
def pd(swa_model_dir):
    p = swa_engine(swa_model_dir, {"g2_blocks": 32, "pd_port": free_port()},
                   role="kv_producer", name="swa-prefill")
    try:
        d = swa_engine(swa_model_dir, {"g2_blocks": 32, "pd_port": free_port()},
                       role="kv_consumer", name="swa-decode")
    except BaseException:
        p.close()
        raise
    yield p, d
    d.close()
    p.close()


def test_each_groups_blocks_reach_the_decode_byte_for_byte(pd, swa_baseline):
    prefill, decode = pd
    groups = prefill.call("groups")["groups"]
    ps = [prompt(40), prompt(41, 200)]
    out = prefill.generate(ps, 1, kv_transfer_params=[{"do_remote_decode": True}] * len(ps))
    params = out["kv_transfer_params"]
    for p in params:
        assert p and p.get("do_remote_prefill"), params
        lists = p["remote_block_ids"]
        assert len(lists) == len(groups) == len(p["kvbm_groups"]), p
    window = next(i for i, g in enumerate(groups) if g["spec"] == "SlidingWindowSpec")
    full = 1 - window
    for p, tokens in zip(params, ps):
        # The full group sends every computed block; the window its tail.
        assert len(p["remote_block_ids"][full]) == -(-len(tokens) // 32)
        assert len(p["remote_block_ids"][window]) < len(p["remote_block_ids"][full])
    prefill.call("step", n=2)  # the prefill holds them now (a server keeps stepping)
    # The prefill's bytes of every block it sent, over its group's layers.
    want = {}
    for p in params:
        for g, ids in enumerate(p["remote_block_ids"]):
            ids = [b for b in ids if b]
            for b, d in zip(ids, prefill.call("digests", block_ids=[ids], group=g)
                            ["digests"][0][0]):
                want[(g, b)] = d
    got = decode.generate(ps, 8, kv_transfer_params=params)
    assert got["tokens"] == swa_baseline(ps, 8)
    pulled = records(got, "pulled")
    assert len(pulled) == len(ps), got["records"]
    checked = {window: 0, full: 0}
    for r, p in zip(sorted(pulled, key=lambda r: len(r["block_ids"])),
                    sorted(params, key=lambda p: len(p["remote_block_ids"][full]))):
        assert r["failed"] == 0, r
        assert len(r["remote_block_ids"]) == len(r["block_ids"]) > 0, r
        for i, rb in enumerate(r["remote_block_ids"]):
            g = next(g for g, ids in enumerate(p["remote_block_ids"]) if rb in ids)
            assert r["group_digests"][str(g)][i] == want[(g, rb)], (g, rb, r)
            checked[g] += 1
    assert checked[full] > 0 and checked[window] > 0, checked
    print(f"hybrid P/D: {checked[full]} full-attention and {checked[window]} window blocks "
          f"pulled, bytes equal per group")
