"""kvbmgo.dense_span: the memory under a strided view, for registering an
engine's KV views (vLLM 0.32 to 0.34 hand strided per-layer views) without a copy."""
import numpy as np
import pytest

import kvbmgo
from kvbmgo import Buffer, LayoutConfig, Tier, Worker, dense_span

from conftest import new_worker_id


def test_a_permuted_view_spans_its_base():
    base = np.arange(4 * 3 * 5 * 2, dtype=np.uint16).reshape(4, 3, 5, 2)
    view = base.transpose(0, 2, 1, 3)  # [B, N, H, C] seen as [B, H, N, C] and back
    b = dense_span(view)
    assert b.address == base.__array_interface__["data"][0]
    assert (b.nbytes, b.itemsize, b.device) == (base.nbytes, 2, None)
    assert b.owner is view


def test_size_one_dims_may_have_any_stride():
    a = np.zeros((3, 1, 4), dtype=np.float32)
    assert dense_span(a[:, :, :]).nbytes == a.nbytes


@pytest.mark.parametrize("make", [
    lambda a: a[:, ::2],          # a gap
    lambda a: a[::-1],            # a negative stride
    lambda a: np.lib.stride_tricks.as_strided(a, shape=(4, 8), strides=(4, 2)),  # overlap
])
def test_views_that_are_not_one_region_are_refused(make):
    a = np.zeros((4, 8), dtype=np.uint16)
    with pytest.raises(ValueError, match="dense region"):
        dense_span(make(a))


def test_bad_objects():
    with pytest.raises(TypeError):
        dense_span(b"bytes")
    with pytest.raises(ValueError, match="read-only"):
        a = np.zeros(4, dtype=np.uint8)
        a.flags.writeable = False
        dense_span(a)
    with pytest.raises(ValueError, match="empty"):
        dense_span(np.zeros((0, 4), dtype=np.uint8))


def test_a_strided_view_registers_as_g1_and_round_trips():
    # A [B, H, N, C] view over [B, N, H, C] memory, as vLLM's LBNHC layout.
    B, H, N, C = 4, 2, 4, 8
    base = np.zeros((B, N, H, C), dtype=np.uint16)
    view = base.transpose(0, 2, 1, 3)
    cfg = LayoutConfig(num_blocks=B, num_layers=1, outer_dim=1, page_size=N, inner_dim=H * C,
                       dtype_width=2, layout="layer_separate", block_dim="first")
    with Worker(new_worker_id()) as w:
        w.register_g1(cfg, [dense_span(view)])
        w.allocate_g2(cfg.replace(layout="fully_contiguous"))
        view[1] = np.arange(H * N * C, dtype=np.uint16).reshape(H, N, C)
        want = base[1].copy()
        with w.transfer(Tier.G1, [1], Tier.G2, [0]) as n:
            assert n.wait(10)
        base[:] = 0
        with w.transfer(Tier.G2, [0], Tier.G1, [3]) as n:
            assert n.wait(10)
        np.testing.assert_array_equal(base[3], want)
        assert not base[:3].any()


def test_an_empty_buffer_is_refused():
    with pytest.raises(ValueError, match="empty"):
        kvbmgo._memory.buffer_of(Buffer(0, 0, 2, None, None))
