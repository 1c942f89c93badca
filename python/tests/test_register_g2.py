"""G2 over the engine's own host memory (register_g2): transfers read and write
it in place."""
import numpy as np
import pytest

from kvbmgo import LayoutConfig, Tier, Worker
from kvbmgo.errors import AlreadyExistsError

from conftest import new_worker_id, wait_ok

CFG = LayoutConfig(num_blocks=6, num_layers=2, outer_dim=2, page_size=4, inner_dim=64,
                   dtype_width=2, layout="layer_separate", block_dim="first")


def test_transfers_read_and_write_registered_host_memory_in_place():
    g1 = [np.zeros(CFG.layer_bytes // 2, dtype=np.uint16) for _ in range(2)]
    pool = [np.zeros(CFG.layer_bytes // 2, dtype=np.uint16) for _ in range(2)]
    with Worker(new_worker_id()) as w:
        w.register_g1(CFG, g1)
        w.register_g2(CFG, pool)
        with pytest.raises(AlreadyExistsError):
            w.allocate_g2(CFG)
        for layer, a in enumerate(g1):
            a[:] = (np.arange(a.size) * 3 + layer) % 65521
        wait_ok(w.transfer(Tier.G1, [1, 4], Tier.G2, [0, 5]))
        block = CFG.layer_bytes // CFG.num_blocks // 2  # uint16 elements of one block in a layer
        for layer in range(2):
            np.testing.assert_array_equal(pool[layer][0:block], g1[layer][block:2 * block])
            np.testing.assert_array_equal(pool[layer][5 * block:6 * block], g1[layer][4 * block:5 * block])
            assert not pool[layer][block:5 * block].any(), "blocks 1..4 of the pool stay untouched"
        # The engine writes its pool; onboarding reads it from there.
        for layer in range(2):
            pool[layer][2 * block:3 * block] = 7 + layer
        wait_ok(w.transfer(Tier.G2, [2], Tier.G1, [0]))
        for layer in range(2):
            assert (g1[layer][0:block] == 7 + layer).all()


def test_register_g2_refuses_what_is_not_host_memory_of_the_layout():
    with Worker(new_worker_id()) as w:
        with pytest.raises(ValueError, match="needs 2"):
            w.register_g2(CFG, [np.zeros(CFG.layer_bytes // 2, dtype=np.uint16)])
        with pytest.raises(TypeError, match="element size 1"):
            w.register_g2(CFG, [np.zeros(CFG.layer_bytes, dtype=np.uint8)] * 2)
        with pytest.raises(ValueError, match="bytes"):
            w.register_g2(CFG, [np.zeros(8, dtype=np.uint16)] * 2)


def test_host_memory_as_g1_serves_the_prefix_cache():
    """G1 over host memory (register_g1_host): offload and onboard through the
    prefix cache, every byte back, neighbours untouched."""
    cfg = LayoutConfig(num_blocks=8, num_layers=2, outer_dim=2, page_size=4, inner_dim=64,
                       dtype_width=2, layout="fully_contiguous")
    pool = np.zeros(cfg.total_bytes // 2, dtype=np.uint16)
    with Worker(new_worker_id()) as w:
        w.register_g1_host(cfg, pool)
        w.allocate_g2(cfg)
        cache = w.enable_cache()
        per = cfg.block_bytes // 2
        want = (np.arange(pool.size) * 5 % 65521).astype(np.uint16)
        pool[:] = want
        keys = [bytes([k]) * 32 for k in (1, 2, 3)]
        n, _ = cache.offload(keys, [0, 1, 2])
        wait_ok(n)
        pool[:] = 0
        wait_ok(cache.onboard(keys, [5, 6, 7]))
        for src, dst in ((0, 5), (1, 6), (2, 7)):
            np.testing.assert_array_equal(pool[dst * per:(dst + 1) * per], want[src * per:(src + 1) * per])
        assert not pool[:5 * per].any(), "blocks 0..4 stay as they were"
    with Worker(new_worker_id()) as w, pytest.raises(TypeError, match="element size"):
        w.register_g1_host(cfg, np.zeros(cfg.total_bytes, dtype=np.uint8))
