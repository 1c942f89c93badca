"""Two workers in one process (mirrors examples/c/remote.c)."""
import gc
import weakref

import numpy as np
import pytest

from kvbmgo import (CoordinatedWorker, HeadSlice, LayoutConfig, LayoutHandle, Tier, TransferPath,
                    Worker)
from kvbmgo.errors import AlreadyExistsError, CanceledError, InvalidArgumentError, NotFoundError

from conftest import new_worker_id, wait_ok

NB = 6
CFG = LayoutConfig(num_blocks=NB, num_layers=3, outer_dim=2, page_size=8, inner_dim=32,
                   dtype_width=2, layout="fully_contiguous")
IDS = list(range(NB))
INSTANCE_B = 0xB0B0


def make_worker():
    g1 = np.zeros(CFG.total_bytes // 2, dtype=np.float16)
    w = Worker(new_worker_id())
    w.register_g1(CFG, g1)
    w.allocate_g2(CFG)
    return w, g1


def test_remote_pull():
    a, g1a = make_worker()
    b, g1b = make_worker()
    with a, b:
        want = np.random.default_rng(2).standard_normal(g1b.shape).astype(np.float16)
        g1b[:] = want
        wait_ok(b.transfer(Tier.G1, IDS, Tier.G2, IDS))
        md_b = b.export_metadata()
        md_a = a.export_metadata()
        assert isinstance(md_b, bytes) and md_b

        # Worker path.
        a.connect_remote(INSTANCE_B, md_b)
        wait_ok(a.transfer_from_instance(INSTANCE_B, Tier.G2, IDS, Tier.G1, IDS))
        np.testing.assert_array_equal(g1a, want)

        # Leader path.
        g1a[:] = 0
        with CoordinatedWorker(a, 0, 0xA0A0) as c:
            c.apply_layout_response(md_a)
            c.import_remote_metadata(INSTANCE_B, 0, md_b)
            remote_g1 = c.resolve_remote_handle(INSTANCE_B, 0, Tier.G1)
            assert remote_g1.worker == b.worker_id
            with pytest.raises(NotFoundError):
                c.resolve_remote_handle(INSTANCE_B, 7, Tier.G1)
            with pytest.raises(AlreadyExistsError):
                c.set_local(Tier.G1, remote_g1)
            rev = IDS[::-1]
            wait_ok(c.transfer_from_remote(INSTANCE_B, 0, Tier.G1, IDS, Tier.G2, rev))
            wait_ok(a.transfer(Tier.G2, rev, Tier.G1, IDS))
            np.testing.assert_array_equal(g1a, want)
            with pytest.raises(NotFoundError) as e:
                c.transfer_from_remote(0xDEAD, 0, Tier.G1, IDS, Tier.G2, IDS)
            assert e.value.message


def test_closing_worker_closes_its_coordinated_workers():
    a, _ = make_worker()
    c = CoordinatedWorker(a, 0, 1)
    a.close()
    assert c.closed


def test_transfer_to_and_from_remote_layout():
    a, g1a = make_worker()
    b, g1b = make_worker()
    with a, b:
        want = np.arange(g1a.size, dtype=np.float16)
        g1a[:] = want
        a.import_metadata(b)  # the Worker itself: a keeps b alive while it lives
        with CoordinatedWorker(a, 0, 1) as c:
            c.import_remote_metadata(7, 0, b.export_metadata())
            remote_g2 = c.resolve_remote_handle(7, 0, Tier.G2)
        # Offload A's G1 into B's G2 (a peer), then pull it back into A's G1.
        wait_ok(a.transfer_to_remote(Tier.G1, IDS, remote_g2, IDS[::-1]))
        wait_ok(b.transfer(Tier.G2, IDS[::-1], Tier.G1, IDS))
        np.testing.assert_array_equal(g1b, want)
        g1a[:] = 0
        wait_ok(a.transfer_from_remote(remote_g2, IDS[::-1], Tier.G1, IDS))
        np.testing.assert_array_equal(g1a, want)
        with pytest.raises(NotFoundError):
            a.transfer_from_remote(LayoutHandle(0xDEAD, 0), IDS, Tier.G1, IDS)
        counters = a.counters()
        assert set(counters) == set(TransferPath)
        assert sum(p.transfers for p in counters.values()) >= 2
        assert sum(p.bytes for p in counters.values()) >= 2 * CFG.total_bytes


@pytest.mark.parametrize("form", ["bytes", "worker", "coordinated"])
def test_closing_an_exporter_under_an_importer(form):
    """An importer keeps the exporter's G1 memory alive past the exporter's
    close(); its transfers from the closed exporter fail with a kvbmgo error."""
    a, _ = make_worker()
    b = Worker(new_worker_id())
    g1b = np.zeros(CFG.total_bytes // 2, dtype=np.float16)
    remote_g1 = b.register_g1(CFG, g1b)
    ref = weakref.ref(g1b)
    md_b = b.export_metadata()
    if form == "bytes":
        a.import_metadata(md_b)
    elif form == "worker":
        a.import_metadata(b)
    else:
        with CoordinatedWorker(a, 0, 1) as c:
            c.import_remote_metadata(7, 0, md_b)
            assert c.resolve_remote_handle(7, 0, Tier.G1) == remote_g1
    wait_ok(a.transfer_from_remote(remote_g1, IDS, Tier.G2, IDS))
    b.close()
    assert b._g1 == []  # rebound, not emptied under the importer
    del b, g1b
    gc.collect()
    assert ref() is not None, "the importer let go of the exporter's G1 memory"
    with pytest.raises((CanceledError, NotFoundError)):
        with a.transfer_from_remote(remote_g1, IDS, Tier.G2, IDS) as n:
            n.wait(10)
    a.close()
    gc.collect()
    assert ref() is None


def test_closing_an_exporter_during_a_pull():
    """The exporter closes while an importer's pull from its G1 is in flight:
    the pull completes or fails with a kvbmgo error, never reads freed memory."""
    cfg = LayoutConfig(num_blocks=64, num_layers=8, outer_dim=2, page_size=16, inner_dim=512,
                       dtype_width=2, layout="fully_contiguous")  # 16 MiB
    ids = list(range(64))
    workers = []
    for _ in range(2):
        w = Worker(new_worker_id())
        g1 = np.full(cfg.total_bytes // 2, 5, np.float16)
        workers.append((w, g1, w.register_g1(cfg, g1)))
        w.allocate_g2(cfg)
    (a, _, _), (b, g1b, remote_g1) = workers
    ref = weakref.ref(g1b)
    a.import_metadata(b.export_metadata())
    n = a.transfer_from_remote(remote_g1, ids, Tier.G2, ids)
    b.close()
    del workers, w, g1, b, g1b
    gc.collect()
    assert ref() is not None
    with n:
        try:
            assert n.wait(10)
        except (CanceledError, NotFoundError):
            pass
    a.close()
    gc.collect()
    assert ref() is None


def test_exporter_id_read_through_the_library():
    """Whose metadata bytes are is asked of the library (kvbm_metadata_worker_id),
    not parsed by hand: a forged or truncated header names no worker."""
    exporter_id = Worker.exporter_id
    a, _ = make_worker()
    with a:
        md = a.export_metadata()
        assert exporter_id(md) == a.worker_id
        assert exporter_id(md[:16]) is None  # a header alone: not metadata
        assert exporter_id(b"") is None
        assert exporter_id(b"junk" * 8) is None


def test_head_slice_pull_fills_this_workers_heads():
    """A decode of half the heads takes heads [2, 4) of a prefill's blocks,
    tokens-outer (NHD) there, heads-outer (HND) here; then heads [0, 2) of
    another, so a block fills from two: every byte as numpy slices it."""
    page, hb, layers = 4, 8, 2  # bytes of one head of one token

    def worker(heads):
        cfg = LayoutConfig(num_blocks=NB, num_layers=layers, outer_dim=1, page_size=page,
                           inner_dim=heads * hb, dtype_width=1, layout="fully_contiguous")
        g1 = np.zeros(cfg.total_bytes, dtype=np.uint8)
        w = Worker(new_worker_id())
        w.register_g1(cfg, g1)
        return w, g1

    a, g1a = worker(4)  # the prefill: [block][layer][token][head][hb] (NHD)
    d, g1d = worker(2)  # the decode: [block][layer][head][token][hb] (HND)
    with a, d:
        g1a[:] = np.random.default_rng(5).integers(0, 256, g1a.size, dtype=np.uint8)
        d.connect_remote(7, a.export_metadata())
        src = g1a.reshape(NB, layers, page, 4, hb)
        dst = g1d.reshape(NB, layers, 2, page, hb)
        want = dst.copy()
        s = HeadSlice(count=2, src_heads=4, src_first=2, src_order="NHD",
                      dst_heads=2, dst_first=0, dst_order="HND")
        wait_ok(d.transfer_from_instance(7, Tier.G1, [1, 4], Tier.G1, [3, 0], heads=s))
        for sb, db in ((1, 3), (4, 0)):
            want[db] = src[sb, :, :, 2:4].transpose(0, 2, 1, 3)
        np.testing.assert_array_equal(dst, want)
        one = HeadSlice(count=1, src_heads=4, src_first=0, src_order="NHD",
                        dst_heads=2, dst_first=1, dst_order="HND")
        wait_ok(d.transfer_from_instance(7, Tier.G1, [5], Tier.G1, [3], heads=one))
        want[3, :, 1] = src[5, :, :, 0]
        np.testing.assert_array_equal(dst, want)
        with pytest.raises(InvalidArgumentError, match=r"source heads \[3, 5\)"):
            d.transfer_from_instance(7, Tier.G1, [0], Tier.G1, [0], heads=HeadSlice(
                count=2, src_heads=4, src_first=3, src_order="NHD",
                dst_heads=2, dst_first=0, dst_order="HND"))
        with pytest.raises(ValueError, match="'HND' or 'NHD'"):
            d.transfer_from_instance(7, Tier.G1, [0], Tier.G1, [0], heads=HeadSlice(
                count=1, src_heads=4, src_first=0, src_order="BHND",
                dst_heads=2, dst_first=0, dst_order="HND"))
        # Without a slice, blocks of 4 heads do not fit blocks of 2.
        with pytest.raises(InvalidArgumentError, match="incompatible"):
            d.transfer_from_instance(7, Tier.G1, [0], Tier.G1, [0])
