"""Sleep mode and weight updates: vLLM lends the KV cache's memory away
(unregister_kv_caches), the memory is really unmapped meanwhile, and comes
back (restore_kv_caches). A stale access by kvbm faults the test process."""
from harness import require_vllm

require_vllm()

import pytest  # noqa: E402
import torch  # noqa: E402

from harness import BLOCK, LAYERS, Engine, pattern  # noqa: E402
from mapped import Mapped  # noqa: E402

from kvbmgo import Tier, Worker  # noqa: E402
from kvbmgo.errors import FailedPreconditionError  # noqa: E402


@pytest.fixture
def mapped_engine():
    maps = []

    def alloc(size):
        m = Mapped(size)
        maps.append(m)
        return m.tensor()

    e = Engine({"g2_blocks": 32}, alloc=alloc)
    yield e, maps[0]
    e.close()
    if not maps[0].mapped:
        maps[0].remap()  # the engine's views are still alive: never left unmapped
    maps[0].close()


def _offload(e, first, blocks):
    """A request of `blocks` full blocks (+3 tokens) runs and its blocks are
    offloaded to G2; returns (request, prompt)."""
    prompt = list(range(first, first + blocks * BLOCK + 3))
    r = e.add(f"R{first}", prompt)
    e.run()
    e.settle()
    return r, prompt


def _loads_back(e, r, prompt, blocks):
    """The G1 blocks of a request sharing r's prefix are loaded from G2,
    byte for byte."""
    assert e.sched.reset_prefix_cache()
    e.raw.zero_()
    seen = {}

    def check(so):
        req_id = f"B{prompt[0]}"
        if req_id in so.num_scheduled_tokens and not seen:
            ids = e.block_ids(req_id)
            for i in range(blocks):
                for layer in range(len(LAYERS)):
                    assert torch.equal(e.read(ids[i], layer), pattern(r.block_hashes[i], layer))
            seen["scheduled"] = so.num_scheduled_tokens[req_id]
    e.add(f"B{prompt[0]}", prompt[:blocks * BLOCK] + list(range(900, 905)))
    e.run(before_forward=check)
    assert seen["scheduled"] == 5, "only its own tokens computed"


def _decode_of(e, metadata, wid):
    """A second kvbm worker (a decode) connected to e's worker with
    metadata (in this process: through the loopback transport)."""
    cfg = e.worker._worker._g1[0]
    d = Worker(wid)
    d.allocate_g2(cfg.replace(layout="fully_contiguous", num_blocks=4))
    d.connect_remote(1, metadata)
    return d


def test_sleep_unmaps_g1_and_restore_brings_it_back(mapped_engine):
    e, mem = mapped_engine
    kv = e.worker._worker
    w = kv.worker
    r, prompt = _offload(e, 100, 2)
    whole = w.export_metadata(read_only=True)
    scoped = w.export_metadata(blocks={Tier.G1: [0, 1]}, expires=60)
    decodes = [_decode_of(e, md, 0xDEC0DE + i) for i, md in enumerate((whole, scoped))]
    try:
        for d in decodes:  # both pull G1 before the sleep
            d.transfer_from_instance(1, Tier.G1, [0], Tier.G2, [0]).wait()

        e.worker.unregister_kv_caches()
        e.worker.unregister_kv_caches()  # idempotent
        mem.unmap()  # from here, any access to G1 faults the test process
        for d in decodes:
            with pytest.raises(FailedPreconditionError, match="unregistered by its owner: vLLM lent"):
                d.transfer_from_instance(1, Tier.G1, [0, 1], Tier.G2, [1, 2]).wait()
        # The worker's own transfers on G1 are refused too, the cache's as well.
        with pytest.raises(FailedPreconditionError, match="unregistered"):
            w.transfer(Tier.G2, [0], Tier.G1, [0]).wait()
        with pytest.raises(FailedPreconditionError, match="unregistered"):
            w.cache.onboard([bytes(r.block_hashes[0])], [3]).wait()
        decodes[0].transfer_from_instance(1, Tier.G2, [0], Tier.G2, [3]).wait()  # G2 still served

        mem.remap()  # fresh zero pages at the same address
        e.worker.restore_kv_caches()
        e.worker.restore_kv_caches()  # idempotent
        with pytest.raises(FailedPreconditionError, match="unregistered by its owner"):
            decodes[0].transfer_from_instance(1, Tier.G1, [0], Tier.G2, [1]).wait()
    finally:
        for d in decodes:
            d.close()
    # G2 kept A's blocks through the sleep: a request with its prefix loads
    # them into the new G1, byte for byte; and new blocks are offloaded.
    _loads_back(e, r, prompt, 2)
    r2, prompt2 = _offload(e, 3000, 2)
    assert w.cache.match([bytes(h) for h in r2.block_hashes[:2]])[0] == 2


def test_sleep_finishes_the_stores_outstanding(mapped_engine):
    """A store the worker side started and has not seen finish when vLLM
    sleeps is finished before the memory goes (never after: the unmap would
    fault it), and what it stored loads back byte for byte after the
    wake-up. That the library's own transfers in flight are waited for is
    core/transfer's and core/worker's withdrawal tests."""
    from kvbmgo.vllm.metadata import BlockLoad, BlockStore, KvbmConnectorMetadata
    e, mem = mapped_engine
    kw = e.worker._worker
    keys = [f"sleep-store-{i}".encode() for i in range(3)]
    for b in range(3):
        for layer in range(len(LAYERS)):
            e.write(b, layer, pattern(keys[b], layer))
    md = KvbmConnectorMetadata(stores=[BlockStore("S", keys, [0, 1, 2])])
    kw.bind()
    kw.start_load_kv(md)
    kw.wait_for_save(md)
    assert kw._stores, "the store is outstanding at the sleep"
    e.worker.unregister_kv_caches()
    assert not kw._stores
    mem.unmap()
    assert kw.worker.cache.match(keys)[0] == 3
    mem.remap()
    e.worker.restore_kv_caches()
    md = KvbmConnectorMetadata(loads=[BlockLoad("L", keys, [5, 6, 7])])
    kw.bind()
    kw.start_load_kv(md)
    for name in LAYERS:
        kw.wait_for_layer_load(name)
    kw.wait_for_save(md)
    assert not kw.get_block_ids_with_load_errors()
    for i, b in enumerate([5, 6, 7]):
        for layer in range(len(LAYERS)):
            assert torch.equal(e.read(b, layer), pattern(keys[i], layer))


def test_connector_declares_sleep_mode_support(monkeypatch):
    from kvbmgo.vllm import KvbmConnector
    assert KvbmConnector.supports_sleep_mode(None) is True
    monkeypatch.setenv("KVBM_TRANSPORT", "ucx")
    assert KvbmConnector.supports_sleep_mode(None) is True
    monkeypatch.delenv("KVBM_TRANSPORT")
    monkeypatch.setenv("KVBM_CUDA_IPC", "1")  # a decode's IPC mapping would outlive the sleep
    assert KvbmConnector.supports_sleep_mode(None) is False


def test_a_prefill_that_sleeps_lets_go_of_its_held_requests_and_refuses_pulls(caplog):
    """A prefill holds R for a decode and sleeps: R is let go (vLLM frees its
    blocks), the decode's pull is refused saying why, and every block of it
    fails; after the wake-up a new request is handed over byte for byte."""
    from test_disagg import PROMPT, decode_engine, prefill, prefill_engine, run_both
    p, d = prefill_engine(), decode_engine()
    try:
        _, params, _ = prefill(p)
        p.step()  # the prefill worker learns that it holds R
        assert p.worker._worker._server.held() == {"R"}
        p.worker.unregister_kv_caches()
        assert p.worker._worker._server.held() == set()
        p.run(timeout=5)
        assert [o.finished_sending for o in p.outputs if o.finished_sending] == [{"R"}]
        d.add("R-decode", PROMPT, kv_transfer_params=params)
        d.step()
        ids = d.block_ids("R-decode")[:3]
        d.run(timeout=5)
        assert set().union(*(o.invalid_block_ids for o in d.outputs)) == set(ids)
        assert d.finished["R-decode"].finish_reason.name == "ERROR"
        assert any("unavailable: vLLM lent the KV cache's memory away" in r.getMessage()
                   for r in caplog.records), "the decode says why"

        p.worker.restore_kv_caches()
        r2, params2, want = prefill(p, "R2", [t + 1 for t in PROMPT])
        d.add("R2-decode", [t + 1 for t in PROMPT], max_tokens=2, kv_transfer_params=params2)
        seen = {}

        def check(so):
            if "R2-decode" in so.num_scheduled_tokens and not seen:
                b = d.block_ids("R2-decode")
                seen["ok"] = all(torch.equal(d.read(b[i], layer), want[i][layer])
                                 for i in range(3) for layer in range(len(LAYERS)))
        run_both(p, d, before_forward=check)
        assert seen["ok"], "handed over byte for byte after the wake-up"
    finally:
        d.close()
        p.close()

