"""A persistent G3 through kvbmgo (Worker(g3_persist_id=...)): a new
worker over the same directory and id finds the keys an earlier one wrote
to G3, each block checked against its checksums first; another id finds
nothing; one worker owns the directory at a time."""
import time

import numpy as np
import pytest

from kvbmgo import LayoutConfig, Worker
from kvbmgo.errors import KvbmError

from conftest import new_worker_id
from test_cache import BLOCKS, INNER, LAYERS, OUTER, PAGE, block_hashes, check_loaded, compute

ID = "model=tiny;dtype=bf16;layout=LBNHC;rank=0;tp=1"


def _worker(disk, persist_id=ID):
    """A worker with G1 (16 blocks), G2 (4) and a persistent G3 (8) written
    through, and its cache; returns (worker, G1 layers)."""
    layers = [np.zeros((BLOCKS, OUTER, PAGE, INNER), dtype=np.uint16) for _ in range(LAYERS)]
    cfg = LayoutConfig(num_blocks=BLOCKS, num_layers=LAYERS, outer_dim=OUTER, page_size=PAGE,
                       inner_dim=INNER, dtype_width=2, layout="layer_separate", block_dim="first")
    w = Worker(new_worker_id(), disk_dir=disk, g3_persist_id=persist_id)
    try:
        w.register_g1(cfg, layers)
        host = cfg.replace(layout="fully_contiguous")
        w.allocate_g2(host.replace(num_blocks=4))
        w.allocate_g3(host.replace(num_blocks=8))
        w.enable_cache(g3="write-through")
    except BaseException:
        w.close()
        raise
    return w, layers


def _restored(w, want, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        st = w.cache.stats()
        if st.g3_restored + st.g3_refused >= want:
            return st
        assert time.monotonic() < deadline, st
        time.sleep(0.01)


@pytest.fixture
def disk(tmp_path):
    d = tmp_path / "g3"
    d.mkdir(mode=0o700)
    return d


def test_keys_written_to_g3_come_back_in_a_new_worker(disk):
    keys = block_hashes(list(range(4 * PAGE)))
    w, layers = _worker(disk)
    with w:
        compute(layers, range(4), keys)
        n, _ = w.cache.offload(keys, list(range(4)))
        with n:
            assert n.wait(10)
        deadline = time.monotonic() + 10
        while w.cache.stats().g3.registered < 4:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    w, layers = _worker(disk)
    with w:
        st = _restored(w, 4)
        assert (st.g3_restored, st.g3_refused) == (4, 0)
        matched, tiers = w.cache.match(keys)
        assert matched == 4 and list(tiers) == [3] * 4
        n = w.cache.onboard(keys, [8, 9, 10, 11])
        with n:
            assert n.wait(10)
        check_loaded(layers, [8, 9, 10, 11], keys)


def test_another_id_finds_nothing_and_one_worker_owns_the_directory(disk):
    keys = block_hashes(list(range(2 * PAGE)))
    w, layers = _worker(disk)
    with w:
        compute(layers, range(2), keys)
        n, _ = w.cache.offload(keys, [0, 1])
        with n:
            assert n.wait(10)
        # A second worker on the same directory while the first has it.
        with pytest.raises(KvbmError, match="another process has it open"):
            _worker(disk)
    w, _ = _worker(disk, ID + ";another-model")
    with w:
        time.sleep(0.1)
        assert w.cache.stats().g3_restored == 0
        assert w.cache.match(keys)[0] == 0
