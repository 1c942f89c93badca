"""The G4 object store through a worker."""
import numpy as np
import pytest

from kvbmgo import LayoutConfig, Tier, Worker
from kvbmgo.errors import InvalidArgumentError, KvbmError, NotFoundError, UnsupportedError

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
