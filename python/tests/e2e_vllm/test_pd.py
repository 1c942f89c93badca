"""Disaggregated prefill->decode between two real vLLM engine processes: a
kv_producer prefills (max_tokens 1, do_remote_decode), a kv_consumer pulls
the request's blocks through KvbmConnector and decodes; its tokens equal a
single engine's, and the blocks it pulled hold the prefill's bytes."""
import pytest

from e2e_helpers import Engine, flat_ids, free_port, prompt, records


@pytest.fixture(scope="module")
def pd(model_dir):
    port = free_port()
    p = Engine(model_dir, {"g2_blocks": 32, "pd_port": port}, role="kv_producer",
               name="prefill")
    try:
        d = Engine(model_dir, {"g2_blocks": 32, "pd_port": free_port()}, role="kv_consumer",
                   name="decode")
    except BaseException:
        p.close()
        raise
    yield p, d
    d.close()
    p.close()


def test_prefill_decode_hand_over(pd, baseline):
    prefill, decode = pd
    ps = [prompt(30), prompt(31, 200)]
    out = prefill.generate(ps, 1, kv_transfer_params=[{"do_remote_decode": True}] * len(ps))
    params = out["kv_transfer_params"]
    for p in params:
        assert p and p.get("do_remote_prefill"), params
    prefill.call("step", n=2)  # the prefill now holds them (a server keeps stepping)
    remote = [flat_ids(p["remote_block_ids"]) for p in params]
    want_digests = prefill.call("digests", block_ids=remote)["digests"][0]
    got = decode.generate(ps, 8, kv_transfer_params=params)
    assert got["tokens"] == baseline(ps, 8)
    pulled = records(got, "pulled")
    assert len(pulled) == len(ps), got["records"]
    # Requests finish in any order: match them by their digests' count and bytes.
    assert sorted(r["digests"] for r in pulled) == sorted(want_digests)
    assert all(r["failed"] == 0 for r in pulled), pulled
    print(f"P/D: {[len(r['block_ids']) for r in pulled]} blocks pulled, bytes equal")
