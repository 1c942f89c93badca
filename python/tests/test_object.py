"""The G4 object store through a worker."""
import os
import stat

import numpy as np
import pytest

from kvbmgo import LayoutConfig, Tier, Worker
from kvbmgo.errors import (FailedPreconditionError, InvalidArgumentError, KvbmError,
                           NotFoundError, UnsupportedError)

from conftest import NUM_BLOCKS, clear, fill, new_worker_id, verify

IDS = list(range(NUM_BLOCKS))


def test_object_round_trip(worker):
    w, layers = worker
    keys = [b"hash-00%d" % i for i in range(NUM_BLOCKS)]
    assert w.object_has(keys) == [False] * NUM_BLOCKS
    fill(layers)
    w.object_put(keys, Tier.G1, IDS)
    assert w.object_has(keys) == [True] * NUM_BLOCKS
    assert w.object_has(["hash-000", "nope"]) == [True, False]  # str keys are UTF-8
    clear(layers)
    w.object_get(keys, Tier.G1, np.arange(NUM_BLOCKS))
    verify(layers, "G1 -> G4 -> G1")


def test_object_errors(worker):
    w, _ = worker
    with pytest.raises(NotFoundError) as e:
        w.object_get([b"missing-1", b"missing-2"], Tier.G1, [0, 1])
    assert e.value.block_statuses == [-3, -3]
    with pytest.raises(InvalidArgumentError):
        w.object_has([b"x" * 65])
    with pytest.raises(ValueError, match="as long"):
        w.object_put([b"a", b"b"], Tier.G1, [0])


def test_no_object_store():
    with Worker(new_worker_id()) as w:
        assert w.object_has([b"k"]) == [False]


def test_objects_in_the_background(worker):
    w, layers = worker
    keys = [f"bg-{i}" for i in range(NUM_BLOCKS)]
    fill(layers)
    with w.offload_objects(Tier.G1, IDS, keys) as n:
        assert n.wait(10)
    assert w.object_has(keys) == [True] * NUM_BLOCKS
    clear(layers)
    with w.onboard_objects(keys, Tier.G1, IDS) as n:
        assert n.wait(10) and n.failed_blocks() == []
    verify(layers, "G1 -> G4 -> G1 in the background")
    # Missing objects fail the notification with their destination blocks.
    with w.onboard_objects([keys[0], "missing"], Tier.G1, [0, 5]) as n:
        with pytest.raises(KvbmError):
            n.wait(10)
        assert n.failed_blocks() == [5]
    with pytest.raises(ValueError, match="as long"):
        w.onboard_objects(keys, Tier.G1, [0])


def test_background_objects_without_store():
    with Worker(new_worker_id()) as w:
        cfg = LayoutConfig(num_blocks=1, num_layers=1, outer_dim=1, page_size=1, inner_dim=8,
                           dtype_width=1)
        w.register_g1(cfg, bytearray(8))
        with pytest.raises(UnsupportedError):
            w.offload_objects(Tier.G1, [0], ["k"])


def test_done_is_true_after_a_failed_transfer(worker):
    """done() says finished, like Future.done(): True on failure too, never
    raising; poll() and wait() raise the transfer's error."""
    w, _ = worker
    with w.onboard_objects(["missing-done"], Tier.G1, [3]) as n:
        with pytest.raises(NotFoundError):
            n.wait(10)
        assert n.done() is True
        assert n.done() is True  # again: still no raise
        with pytest.raises(NotFoundError):
            n.poll()
        assert n.failed_blocks() == [3]
    with pytest.raises(Exception, match="closed"):
        n.done()
    with w.transfer(Tier.G1, IDS, Tier.G2, IDS) as n:
        assert n.wait(10)
        assert n.done() is True and n.poll() is True


def test_g3_and_g4_directories_are_private(worker, tmp_path):
    """What kvbm makes for G4 is 0700 (directories) and 0600 (objects)."""
    w, layers = worker
    fill(layers)
    w.object_put([b"private-%d" % i for i in range(2)], Tier.G1, [0, 1])
    seen = 0
    for root, dirs, files in os.walk(tmp_path / "objects"):
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700, root
        for f in files:
            assert stat.S_IMODE(os.stat(os.path.join(root, f)).st_mode) == 0o600, f
            seen += 1
    assert seen == 2


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_directories_others_can_write_are_refused(tmp_path, g1_config, mode):
    """KVBM_ERR_FAILED_PRECONDITION, naming the directory; nothing made in it."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, mode)
    with pytest.raises(FailedPreconditionError, match="chmod 700") as e:
        Worker(new_worker_id(), object_dir=open_dir)
    assert str(open_dir) in str(e.value)
    with Worker(new_worker_id(), disk_dir=open_dir) as w:
        with pytest.raises(FailedPreconditionError, match=str(open_dir)):
            w.allocate_g3(g1_config.replace(layout="fully_contiguous"))
    assert list(open_dir.iterdir()) == []
