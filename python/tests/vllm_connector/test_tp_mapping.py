"""kvbmgo.vllm.tp_mapping against vLLM 0.33's own NixlConnector mapping
(nixl/tp_mapping.py compute_tp_mapping over a TransferTopology): for every
pair of TP sizes it supports, a decode rank reads the prefill ranks NIXL
reads, at the head offsets NIXL reads at, and a prefill rank waits for as
many decode ranks as NIXL's expected_consumers; every head of every decode
rank is filled exactly once; other pairs are refused."""
from harness import require_vllm

require_vllm()

import pytest  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import TransferTopology  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.tp_mapping import (  # noqa: E402
    compute_tp_mapping)
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

from kvbmgo.vllm.tp_mapping import kv_heads, plan, refusal  # noqa: E402

SIZES = [1, 2, 4, 8]


def nixl(rank, d, p, total, mla):
    topo = TransferTopology(tp_rank=rank, tp_size=d, block_size=16, engine_id="decode",
                            is_mla=mla, is_mamba=False, total_num_kv_heads=total,
                            attn_backends=[])
    return topo, compute_tp_mapping(topo, p, (FullAttentionSpec,))


@pytest.mark.parametrize("total", [1, 2, 4, 8])
@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_the_mapping_is_nixl_connectors(total, mla):
    checked = 0
    for p in SIZES:
        for d in SIZES:
            # NixlConnector refuses P_TP > D_TP with replicated prefill heads (non-MLA).
            if not mla and p > d and p > total:
                continue
            filled = {}
            for r in range(d):
                got = plan(r, d, p, total, mla)
                topo, want = nixl(r, d, p, total, mla)
                assert [x.rank for x in got.reads] == list(want.source_ranks_per_group[0]), \
                    (p, d, r)
                local = kv_heads(r, d, total, mla)
                n_local = local[1] - local[0]
                if not mla and d > p:
                    assert got.reads[0].src[0] == want.rank_offset_factor * n_local, (p, d, r)
                for x in got.reads:
                    if not mla and p > d:  # NIXL's slot: where this source lands locally
                        slot = want.rank_to_attention_slot[x.rank]
                        assert x.dst[0] == slot * n_local // len(got.reads), (p, d, r)
                    assert got.consumers[x.rank] == (want.local_consumers if d >= p else 1)
                    assert x.src[1] - x.src[0] == x.dst[1] - x.dst[0]
                    for h in range(*x.dst):
                        assert (r, h) not in filled
                        filled[(r, h)] = x
                    q = kv_heads(x.rank, p, total, mla)
                    # the source heads are the same global heads as the destination's
                    assert q[0] + x.src[0] == local[0] + x.dst[0]
                    assert q[0] + x.src[1] <= q[1]
            assert len(filled) == sum(kv_heads(r, d, total, mla)[1] - kv_heads(r, d, total, mla)[0]
                                      for r in range(d))
            # Every prefill rank is told done, by as many decode ranks as it waits for.
            told = {}
            for r in range(d):
                got = plan(r, d, p, total, mla)
                for q in got.notify:
                    told.setdefault(q, []).append(got.consumers[q])
            assert sorted(told) == list(range(p))
            assert all(len(v) == v[0] and len(set(v)) == 1 for v in told.values()), told
            checked += 1
    assert checked >= 10


def test_replicated_prefill_heads_are_read_once():
    """Beyond NixlConnector (which refuses it): 2 KV heads over 4 prefill
    ranks, decode TP 1: head 0 from rank 0, head 1 from rank 2; ranks 1
    and 3 are only told done."""
    got = plan(0, 1, 4, 2, False)
    assert [(x.rank, x.src, x.dst) for x in got.reads] == [(0, (0, 1), (0, 1)),
                                                          (2, (0, 1), (1, 2))]
    assert got.notify == (0, 1, 2, 3) and set(got.consumers.values()) == {1}


@pytest.mark.parametrize("p,d,total,mla,why", [
    (3, 2, 6, False, "tensor-parallel size 3, this decode 2"),
    (2, 3, 6, False, "tensor-parallel size 2, this decode 3"),
    (4, 2, 6, False, "size 4 neither divides the model's 6 KV heads"),
    (2, 1, 0, False, "number of KV heads is unknown"),
    (0, 1, 2, False, "must be >= 1"),
])
def test_pairs_that_cannot_be_mapped_are_refused(p, d, total, mla, why):
    assert why in refusal(p, d, total, mla)
    with pytest.raises(ValueError, match=why.split(",")[0]):
        plan(0, d, p, total, mla)


@pytest.mark.parametrize("p,d", [(3, 2), (2, 3), (5, 1)])
def test_mla_maps_any_pair(p, d):
    assert refusal(p, d, 0, True) is None
    told = {}
    for r in range(d):
        got = plan(r, d, p, 0, True)
        assert [(x.src, x.dst) for x in got.reads] == [((0, 1), (0, 1))]
        for q in got.notify:
            told.setdefault(q, []).append(got.consumers[q])
    assert sorted(told) == list(range(p))
    assert all(len(v) == v[0] for v in told.values())
