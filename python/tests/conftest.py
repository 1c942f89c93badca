import gc
import itertools
import os
import shutil
import tempfile

import numpy as np
import pytest

import kvbmgo
from kvbmgo import LayoutConfig, Tier, Worker

_ids = itertools.count(0x7000)

# The same-host P/D key (kvbmgo._control.same_host_key) of every side
# channel and engine the suite starts lives in a directory of the suite's
# own, not the user's: set before any test, so that the processes the tests
# start share it.
_RUNTIME_DIR = tempfile.mkdtemp(prefix="kvbm-tests-run-")
os.environ["XDG_RUNTIME_DIR"] = _RUNTIME_DIR


@pytest.fixture(scope="session", autouse=True)
def runtime_dir():
    """The suite's XDG_RUNTIME_DIR (its same-host P/D key), removed at its end."""
    yield _RUNTIME_DIR
    shutil.rmtree(_RUNTIME_DIR, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def no_leaked_handles():
    """Every handle the suite created is freed by its end (kvbm_handle_count() == 0)."""
    yield
    gc.collect()
    assert kvbmgo.handle_count() == 0


def new_worker_id() -> int:
    return next(_ids)


NUM_BLOCKS, NUM_LAYERS, OUTER, PAGE, INNER = 8, 4, 2, 4, 64


@pytest.fixture
def g1_config() -> LayoutConfig:
    return LayoutConfig(num_blocks=NUM_BLOCKS, num_layers=NUM_LAYERS, outer_dim=OUTER,
                        page_size=PAGE, inner_dim=INNER, dtype_width=2,
                        layout="layer_separate", block_dim="first")


def pattern(layer: int, shape, dtype=np.uint16) -> np.ndarray:
    n = int(np.prod(shape))
    return ((np.arange(n, dtype=np.uint64) * 7 + layer * 31 + 1) % 65521).astype(dtype).reshape(shape)


@pytest.fixture
def worker(tmp_path, g1_config):
    """A worker with G1 (numpy, layer separate), G2 and G3; yields (worker, layers)."""
    layers = [np.zeros((NUM_BLOCKS, OUTER, PAGE, INNER), dtype=np.uint16)
              for _ in range(NUM_LAYERS)]
    (tmp_path / "disk").mkdir(mode=0o700)
    with Worker(new_worker_id(), disk_dir=tmp_path / "disk",
                object_dir=tmp_path / "objects") as w:
        w.register_g1(g1_config, layers)
        host = g1_config.replace(layout="fully_contiguous")
        w.allocate_g2(host)
        w.allocate_g3(host)
        yield w, layers


def fill(layers) -> None:
    for l, a in enumerate(layers):
        a[...] = pattern(l, a.shape)


def clear(layers) -> None:
    for a in layers:
        a[...] = 0


def verify(layers, what: str = "") -> None:
    for l, a in enumerate(layers):
        np.testing.assert_array_equal(a, pattern(l, a.shape), err_msg=f"{what} layer {l}")


def wait_ok(n) -> None:
    with n:
        assert n.wait(10.0)
        assert n.done()
        assert n.failed_blocks() == []
