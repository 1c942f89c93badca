"""Every integer that crosses into C is checked against its C type: a value
that does not fit raises InvalidArgumentError naming the argument (never a
silent truncation), a bool or a non-integer raises TypeError naming it."""
import numpy as np
import pytest

from kvbmgo import (CoordinatedWorker, Event, FactKind, HandoffCoordinator, HandoffOrder,
                    LayoutHandle, OutcomeKind, Stream, Tier, Worker, errors)

from conftest import NUM_BLOCKS, NUM_LAYERS, clear, fill, verify, wait_ok

IDS = list(range(NUM_BLOCKS))
BAD = errors.InvalidArgumentError


def test_tier_that_does_not_fit_int32(worker):
    """2**32 + 2 once ran as tier 2 (G2)."""
    w, _ = worker
    with pytest.raises(BAD, match=r"src .*4294967298"):
        w.transfer(2**32 + 2, [0], Tier.G1, [5])
    with pytest.raises(BAD, match=r"dst .*4294967298"):
        w.transfer(Tier.G1, [0], 2**32 + 2, [5])
    with pytest.raises(BAD, match="src"):
        w.transfer(-2**31 - 1, [0], Tier.G1, [5])
    with pytest.raises(TypeError, match="src"):
        w.transfer(True, [0], Tier.G1, [5])
    with pytest.raises(TypeError, match="dst"):
        w.transfer(Tier.G1, [0], 2.0, [5])
    with pytest.raises(TypeError, match="dst"):
        w.transfer(Tier.G1, [0], "2", [5])
    # numpy integers that fit are fine
    wait_ok(w.transfer(np.int64(Tier.G1), [0], np.uint8(Tier.G2), [0]))


def test_layers_that_do_not_fit_uint32(worker):
    """(0, 2**32) once moved every layer, (2**32, 2**32 + 1) layer 0."""
    w, layers = worker
    for bad, what in [((0, 2**32), "layers"), ((2**32, 2**32 + 1), "layers"),
                      ((-1, 1), "layers"), ((0, -1), "layers")]:
        with pytest.raises(BAD, match=what):
            w.transfer(Tier.G1, IDS, Tier.G2, IDS, layers=bad)
    with pytest.raises(TypeError, match="layers"):
        w.transfer(Tier.G1, IDS, Tier.G2, IDS, layers=(False, True))
    with pytest.raises(TypeError, match="layers"):
        w.transfer(Tier.G1, IDS, Tier.G2, IDS, layers=(0.0, 1.0))
    with pytest.raises((TypeError, ValueError), match="layers"):
        w.transfer(Tier.G1, IDS, Tier.G2, IDS, layers=(0, 1, 2))
    # A range that fits still works.
    fill(layers)
    wait_ok(w.transfer(Tier.G1, IDS, Tier.G2, IDS, layers=(0, NUM_LAYERS)))
    clear(layers)
    wait_ok(w.transfer(Tier.G2, IDS, Tier.G1, IDS))
    verify(layers, "after a full layer range")


@pytest.mark.parametrize("kwargs,what", [
    ({"worker_id": 2**64}, "worker_id"),
    ({"worker_id": -1}, "worker_id"),
    ({"worker_id": 1, "device_id": 2**32}, "device_id"),
    ({"worker_id": 1, "device_id": -2**31 - 1}, "device_id"),
    ({"worker_id": 1, "rank": 2**31}, "rank"),
])
def test_worker_config_that_does_not_fit(kwargs, what):
    with pytest.raises(BAD, match=what):
        Worker(**kwargs)


@pytest.mark.parametrize("kwargs,what", [
    ({"worker_id": True}, "worker_id"),
    ({"worker_id": 1.0}, "worker_id"),
    ({"worker_id": 1, "device_id": False}, "device_id"),
    ({"worker_id": 1, "rank": "0"}, "rank"),
])
def test_worker_config_that_is_not_an_int(kwargs, what):
    with pytest.raises(TypeError, match=what):
        Worker(**kwargs)


def test_block_ids_that_do_not_fit_uint32(worker):
    """-1 and 2**32 are refused, not wrapped, in lists and in numpy arrays."""
    w, _ = worker
    for ids in ([-1], [2**32], [0, 2**32 + 3], [2**64], np.array([-1]),
                np.array([2**32], np.int64), np.array([0, 2**40], np.uint64)):
        with pytest.raises(BAD, match="src_ids"):
            w.transfer(Tier.G1, ids, Tier.G2, [0] * len(ids))
        with pytest.raises(BAD, match="dst_ids"):
            w.transfer(Tier.G1, [0] * len(ids), Tier.G2, ids)
    with pytest.raises(TypeError, match="dst_ids"):
        w.transfer(Tier.G1, [0], Tier.G2, [True])
    with pytest.raises(TypeError, match="src_ids"):
        w.transfer(Tier.G1, np.array([True]), Tier.G2, [0])
    with pytest.raises(TypeError, match="src_ids"):
        w.transfer(Tier.G1, ["0"], Tier.G2, [0])


def test_object_and_remote_integers(worker):
    w, _ = worker
    with pytest.raises(BAD, match="tier"):
        w.object_put(["k"], 2**32 + 2, [0])
    with pytest.raises(BAD, match="instance"):
        w.connect_remote(2**64, b"")
    with pytest.raises(BAD, match="instance"):
        w.transfer_from_instance(-1, Tier.G2, [0], Tier.G1, [0])
    with pytest.raises(BAD, match="remote"):
        w.transfer_from_remote(LayoutHandle(2**64, 0), [0], Tier.G1, [0])
    with pytest.raises(BAD, match="src"):
        w.transfer_to_remote(2**32 + 2, [0], LayoutHandle(1, 1), [0])
    with pytest.raises(BAD, match="dst"):
        w.onboard_objects(["k"], 2**32 + 1, [0])
    with pytest.raises(BAD, match="src"):
        w.offload_objects(2**32 + 2, [0], ["k"])


def test_coordinated_integers(worker):
    w, _ = worker
    with pytest.raises(BAD, match="rank"):
        CoordinatedWorker(w, 2**31, 1)
    with pytest.raises(BAD, match="host_instance"):
        CoordinatedWorker(w, 0, 2**64)
    with CoordinatedWorker(w, 0, 1) as c:
        with pytest.raises(BAD, match="tier"):
            c.set_local(2**32 + 2, LayoutHandle(1, 1))
        with pytest.raises(BAD, match="leader"):
            c.resolve_remote_handle(-1, 0, Tier.G2)
        with pytest.raises(BAD, match="rank"):
            c.resolve_remote_handle(1, 2**32, Tier.G2)
        with pytest.raises(BAD, match="leader"):
            c.import_remote_metadata(2**64, 0, b"")
        with pytest.raises(BAD, match="src"):
            c.transfer_from_remote(1, 0, 2**32 + 2, [0], Tier.G1, [0])


def test_stream_event_and_handoff_integers():
    with pytest.raises(BAD, match="device"):
        Stream(2**32)
    with pytest.raises(BAD, match="device"):
        Event(-2**31 - 1)
    with pytest.raises(BAD, match="order"):
        HandoffCoordinator(bytes(16), 2**32 + 1)
    with HandoffCoordinator(bytes(16), HandoffOrder.SOURCE_FIRST) as h:
        h.start()
        with pytest.raises(BAD, match="kind"):
            h.on_fact(2**32 + FactKind.SOURCE_HELD)
        with pytest.raises(BAD, match="full_prompt_tokens"):
            h.on_fact(FactKind.SOURCE_HELD, full_prompt_tokens=-1)
        with pytest.raises(BAD, match="kv_bytes_per_token"):
            h.on_fact(FactKind.SOURCE_HELD, kv_bytes_per_token=2**64)
        with pytest.raises(BAD, match="action_id"):
            h.on_outcome(2**64 + 1, OutcomeKind.SUBMITTED)
        with pytest.raises(BAD, match="outcome"):
            h.on_outcome(1, 2**32 + OutcomeKind.SUBMITTED)
    with pytest.raises(BAD, match="stream"):
        with Event() as e:
            e.record(2**64)


def test_layout_config_fields_that_do_not_fit(g1_config):
    """layout/block_dim given as ints were truncated to int32 (2**32 + 1 ran as 1)."""
    from kvbmgo import LayoutConfig
    with pytest.raises(BAD, match="layout"):
        g1_config.replace(layout=2**32 + 1).to_c()
    with pytest.raises(BAD, match="block_dim"):
        g1_config.replace(block_dim=2**32 + 1).to_c()
    with pytest.raises(BAD, match="num_blocks"):
        g1_config.replace(num_blocks=2**32).to_c()
    with pytest.raises(TypeError, match="page_size"):
        g1_config.replace(page_size=True).to_c()
    with pytest.raises(TypeError, match="layout"):
        g1_config.replace(layout=1.0).to_c()
    assert isinstance(g1_config, LayoutConfig)
