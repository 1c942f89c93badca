"""Offload and onboard through every local tier (mirrors examples/c/offload_onboard.c)."""
import asyncio

import numpy as np
import pytest

import kvbmgo
from kvbmgo import Event, LayoutConfig, Stream, Tier, Worker

from conftest import NUM_BLOCKS, NUM_LAYERS, clear, fill, new_worker_id, pattern, verify, wait_ok

IDS = list(range(NUM_BLOCKS))


def test_info_and_version():
    i = kvbmgo.info()
    assert i.abi_version == kvbmgo.ABI_VERSION
    assert i.version == 100 * kvbmgo.version()[1] + 10000 * kvbmgo.version()[0] + kvbmgo.version()[2]
    assert i.device_backend in ("emulated", "cuda")
    assert kvbmgo.status_string(-2) == "KVBM_ERR_INVALID_HANDLE"


def test_round_trip_every_tier(worker):
    w, layers = worker
    fill(layers)
    # The engine's compute wrote G1 and recorded an event: offload after it.
    with Stream() as compute, Event() as computed:
        computed.record(compute)
        wait_ok(w.transfer(Tier.G1, IDS, Tier.G2, IDS, precondition=computed))
        wait_ok(w.transfer(Tier.G1, IDS, Tier.G3, IDS, precondition=computed))

        # Layer-wise onboard G2 -> G1: check each layer once its event is done.
        clear(layers)
        events = [Event() for _ in range(NUM_LAYERS)]
        try:
            n = w.onboard_layerwise(IDS, IDS, events)
            for l, e in enumerate(events):
                compute.wait_event(e)
                e.synchronize()
                assert e.query()
                np.testing.assert_array_equal(layers[l], pattern(l, layers[l].shape))
            wait_ok(n)
            compute.synchronize()
        finally:
            for e in events:
                e.close()

    # G3 -> G1 in two layer ranges.
    clear(layers)
    wait_ok(w.transfer(Tier.G3, IDS, Tier.G1, IDS, layers=(0, 2)))
    wait_ok(w.transfer(Tier.G3, IDS, Tier.G1, IDS, layers=(2, NUM_LAYERS)))
    verify(layers, "onboard from G3")

    # G3 -> G2 -> G1 with blocks reversed (numpy ids) and back.
    rev = np.arange(NUM_BLOCKS, dtype=np.uint32)[::-1]
    wait_ok(w.transfer(Tier.G3, IDS, Tier.G2, rev))
    clear(layers)
    wait_ok(w.transfer(Tier.G2, rev, Tier.G1, np.arange(NUM_BLOCKS)))
    verify(layers, "G3 -> G2 -> G1")


def test_subset_of_blocks(worker):
    w, layers = worker
    fill(layers)
    wait_ok(w.transfer(Tier.G1, [1, 3], Tier.G2, [0, 1]))
    clear(layers)
    wait_ok(w.transfer(Tier.G2, (0, 1), Tier.G1, (1, 3)))
    for l, a in enumerate(layers):
        want = pattern(l, a.shape)
        np.testing.assert_array_equal(a[[1, 3]], want[[1, 3]])
        assert not a[[0, 2, 4, 5, 6, 7]].any()


def test_await_notification(worker):
    w, layers = worker
    fill(layers)

    async def main():
        with w.transfer(Tier.G1, IDS, Tier.G2, IDS) as n:
            assert await n
        clear(layers)
        with w.transfer(Tier.G2, IDS, Tier.G1, IDS) as n:
            assert await n.wait_async(timeout=10)

    asyncio.run(main())
    verify(layers, "awaited")


def test_vllm_kv_caches(tmp_path):
    """register_kv_caches with vLLM's {layer name: [2, num_blocks, block_size, heads, head_size]}."""
    caches = {f"model.layers.{i}.attn": np.zeros((2, 6, 16, 4, 8), dtype=np.float16)
              for i in range(3)}
    cfg = LayoutConfig.from_kv_caches(caches, page_size=16)
    assert (cfg.num_blocks, cfg.num_layers, cfg.outer_dim, cfg.page_size, cfg.inner_dim,
            cfg.dtype_width) == (6, 3, 2, 16, 32, 2)
    with Worker(new_worker_id()) as w:
        cfg2, h = w.register_kv_caches(caches)
        assert cfg2 == cfg and h.worker == w.worker_id
        w.allocate_g2(cfg.replace(layout="fully_contiguous"))
        rng = np.random.default_rng(1)
        want = {k: rng.standard_normal(v.shape).astype(np.float16) for k, v in caches.items()}
        for k, v in caches.items():
            v[...] = want[k]
        wait_ok(w.transfer(Tier.G1, range(6), Tier.G2, range(6)))
        for v in caches.values():
            v[...] = 0
        wait_ok(w.transfer(Tier.G2, [5, 4], Tier.G1, [5, 4]))
        for k, v in caches.items():
            np.testing.assert_array_equal(v[:, 4:6], want[k][:, 4:6])
            assert not v[:, :4].any()


def test_from_kv_caches_shapes():
    mla = [np.zeros((10, 16, 576), dtype=np.float16) for _ in range(2)]
    c = LayoutConfig.from_kv_caches(mla, block_dim="first")
    assert (c.num_blocks, c.outer_dim, c.page_size, c.inner_dim) == (10, 1, 16, 576)
    first = [np.zeros((10, 2, 16, 4, 8), dtype=np.float32)]
    c = LayoutConfig.from_kv_caches(first, block_dim="first")
    assert (c.num_blocks, c.num_layers, c.outer_dim, c.dtype_width) == (10, 1, 2, 4)
    full = np.zeros((10, 3, 2, 16, 32), dtype=np.uint8)
    c = LayoutConfig.from_kv_caches([full], layout="fully_contiguous")
    assert (c.num_blocks, c.num_layers, c.inner_dim, c.layout_kind) == (10, 3, 32, 1)
    with pytest.raises(ValueError, match="page_size"):
        LayoutConfig.from_kv_caches(mla, block_dim="first", page_size=8)
    with pytest.raises(ValueError, match="kv cache 1"):
        LayoutConfig.from_kv_caches([np.zeros((2, 4, 16, 8)), np.zeros((2, 5, 16, 8))])
    with pytest.raises(ValueError, match="no KV caches"):
        LayoutConfig.from_kv_caches({})
    with pytest.raises(ValueError, match="layout"):
        LayoutConfig.from_kv_caches(mla, layout="banana")


def test_torch_cpu_tensors_round_trip():
    """Real torch CPU tensors (host memory: G1 under the emulated backend),
    registered the vLLM way, move a block to G2 and back."""
    torch = pytest.importorskip("torch")
    if kvbmgo.info().device_backend == "cuda":
        pytest.skip("CPU tensors are not G1 under the cuda backend")
    caches = {f"model.layers.{i}.attn": torch.zeros((2, 6, 16, 4, 8), dtype=torch.float16)
              for i in range(3)}
    with Worker(new_worker_id()) as w:
        cfg, h = w.register_kv_caches(caches)
        assert (cfg.num_blocks, cfg.num_layers, cfg.outer_dim, cfg.page_size, cfg.inner_dim,
                cfg.dtype_width) == (6, 3, 2, 16, 32, 2)
        assert h.worker == w.worker_id
        w.allocate_g2(cfg.replace(layout="fully_contiguous"))
        want = {}
        for i, (k, t) in enumerate(caches.items()):
            want[k] = (torch.arange(t.numel(), dtype=torch.float32).reshape(t.shape) % 1000
                       + i).to(torch.float16)
            t.copy_(want[k])
        wait_ok(w.transfer(Tier.G1, [3], Tier.G2, [0]))
        for t in caches.values():
            t.zero_()
        wait_ok(w.transfer(Tier.G2, [0], Tier.G1, [1]))
        for k, t in caches.items():
            assert torch.equal(t[:, 1], want[k][:, 3]), k
            assert not t[:, [0, 2, 3, 4, 5]].any(), k
