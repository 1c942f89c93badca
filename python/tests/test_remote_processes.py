"""Prefill and decode in two processes over the network transport (mirrors
examples/c/remote_processes.c): pull and push with every byte checked, a
killed or frozen prefill process failing the pull's blocks within the
deadline, and a restarted one reached again by importing its metadata."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import kvbmgo
from kvbmgo import LayoutConfig, Tier, Worker
from kvbmgo.errors import KvbmIOError

from conftest import new_worker_id, wait_ok

NB = 8
CFG = LayoutConfig(num_blocks=NB, num_layers=4, outer_dim=2, page_size=16, inner_dim=256,
                   dtype_width=1, layout="fully_contiguous")
IDS = list(range(NB))
PREFILL = 0xB0B0

# The prefill process: KV into G1, offloaded to G2; prints its metadata, then
# answers "check SEED FIRST LAST" about its G2 and exits on EOF.
PREFILL_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from kvbmgo import LayoutConfig, Tier, Worker
    cfg = LayoutConfig(num_blocks=8, num_layers=4, outer_dim=2, page_size=16, inner_dim=256,
                       dtype_width=1, layout="fully_contiguous")
    ids = list(range(8))
    def pattern(seed):
        return ((np.arange(cfg.total_bytes, dtype=np.uint64) * 13 + seed) % 251).astype(np.uint8)
    g1 = pattern(5)
    with Worker(0xB1) as w:
        w.register_g1(cfg, g1)
        w.allocate_g2(cfg)
        n = w.transfer(Tier.G1, ids, Tier.G2, ids); n.wait(); n.close()
        print("metadata", w.export_metadata().hex(), w.export_metadata(read_only=True).hex(),
              w.export_metadata(blocks={Tier.G2: [3, 2]}, expires=600).hex(), flush=True)
        for line in sys.stdin:
            if line.startswith("revoke "):  # "revoke B,B": G2's blocks change owner
                w.revoke_blocks({Tier.G2: [int(b) for b in line.split()[1].split(",")]})
                print("revoked", flush=True)
                continue
            _, seed, first, last = line.split()
            n = w.transfer(Tier.G2, ids, Tier.G1, ids); n.wait(); n.close()
            lo, hi = int(first) * cfg.block_bytes, int(last) * cfg.block_bytes
            ok = np.array_equal(g1[lo:hi], pattern(int(seed))[lo:hi])
            print("ok" if ok else "bad", flush=True)
""")


def pattern(seed):
    return ((np.arange(CFG.total_bytes, dtype=np.uint64) * 13 + seed) % 251).astype(np.uint8)


pytestmark = pytest.mark.skipif(kvbmgo.info().transport == "loopback",
                                reason="KVBM_TRANSPORT=loopback reaches only this process")


class Prefill:
    def __init__(self):
        env = dict(os.environ, KVBM_TCP_LISTEN="127.0.0.1:0")
        self.proc = subprocess.Popen([sys.executable, "-c", PREFILL_SCRIPT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        assert line.startswith("metadata "), line
        self.metadata = bytes.fromhex(line.split()[1])
        self.read_only = bytes.fromhex(line.split()[2])
        self.blocks_2_3 = bytes.fromhex(line.split()[3])  # G2's blocks 2 and 3 only

    def check(self, seed, first, last):
        self.proc.stdin.write(f"check {seed} {first} {last}\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def revoke(self, *blocks):
        self.proc.stdin.write("revoke " + ",".join(map(str, blocks)) + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self):
        self.proc.send_signal(signal.SIGSTOP)
        stat = f"/proc/{self.proc.pid}/stat"
        for _ in range(5000):  # the stop takes effect when the process next runs
            with open(stat) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
            time.sleep(0.001)
        raise AssertionError("the prefill process did not stop")

    def close(self):
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def prefill():
    p = Prefill()
    yield p
    p.close()


def decode_worker(deadline):
    g1 = np.zeros(CFG.total_bytes, dtype=np.uint8)
    w = Worker(new_worker_id(), remote_deadline=deadline)
    w.register_g1(CFG, g1)
    w.allocate_g2(CFG)
    return w, g1


def test_pull_and_push_across_processes(prefill):
    w, g1 = decode_worker(10.0)
    with w:
        w.connect_remote(PREFILL, prefill.metadata)
        wait_ok(w.transfer_from_instance(PREFILL, Tier.G2, IDS, Tier.G1, IDS))
        np.testing.assert_array_equal(g1, pattern(5))
        g1[:] = pattern(9)
        h = kvbmgo.LayoutHandle(0xB1, 2)  # the prefill worker's G2: its second layout
        wait_ok(w.transfer_to_remote(Tier.G1, [2, 3], h, [2, 3]))
        assert prefill.check(9, 2, 4) == "ok"
        assert prefill.check(5, 4, NB) == "ok"  # the rest is as it was
        assert w.counters()[kvbmgo.TransferPath.TWO_HOP].blocks == NB + 2


def test_read_only_metadata_pulls_and_cannot_push(prefill):
    w, g1 = decode_worker(10.0)
    with w:
        w.connect_remote(PREFILL, prefill.read_only)
        wait_ok(w.transfer_from_instance(PREFILL, Tier.G2, IDS, Tier.G1, IDS))
        np.testing.assert_array_equal(g1, pattern(5))
        g1[:] = pattern(9)
        h = kvbmgo.LayoutHandle(0xB1, 2)
        with pytest.raises(kvbmgo.errors.UnsupportedError, match="read-only capability"):
            wait_ok(w.transfer_to_remote(Tier.G1, [2, 3], h, [2, 3]))
        assert prefill.check(5, 0, NB) == "ok"  # nothing was written


def test_block_scoped_metadata_reads_its_blocks_only(prefill):
    """A decode holding the metadata of G2's blocks 2 and 3 pulls them, and
    cannot read any other block (refused), nor G1 (not in the metadata)."""
    w, g1 = decode_worker(10.0)
    with w:
        w.connect_remote(PREFILL, prefill.blocks_2_3)
        wait_ok(w.transfer_from_instance(PREFILL, Tier.G2, [2, 3], Tier.G1, [2, 3]))
        bb = CFG.block_bytes
        np.testing.assert_array_equal(g1[2 * bb:4 * bb], pattern(5)[2 * bb:4 * bb])
        theirs = pattern(5)
        for ids in ([4], [1, 2], [0]):
            with pytest.raises(kvbmgo.errors.UnsupportedError, match="request-scoped capability"):
                wait_ok(w.transfer_from_instance(PREFILL, Tier.G2, ids, Tier.G1, [5, 6][:len(ids)]))
            for b in range(NB):  # no byte of an out-of-scope block reached this process
                for out in (4, 1, 0):
                    assert not np.array_equal(g1[b * bb:(b + 1) * bb], theirs[out * bb:(out + 1) * bb])
        with pytest.raises(kvbmgo.errors.NotFoundError):
            w.transfer_from_instance(PREFILL, Tier.G1, [2], Tier.G1, [5])
        w.disconnect_remote(PREFILL)


def test_revoked_block_scoped_metadata_reads_none_of_those_blocks(prefill):
    """The prefill revokes G2's block 2 (its request ended, the block goes
    to another): the decode still connected with the old metadata is
    refused it, and reads block 3 on."""
    w, g1 = decode_worker(10.0)
    with w:
        w.connect_remote(PREFILL, prefill.blocks_2_3)
        wait_ok(w.transfer_from_instance(PREFILL, Tier.G2, [2], Tier.G1, [2]))
        assert prefill.revoke(2) == "revoked"
        g1[:] = 0
        with pytest.raises(kvbmgo.errors.UnsupportedError, match="revoked"):
            wait_ok(w.transfer_from_instance(PREFILL, Tier.G2, [2], Tier.G1, [2]))
        # (G1 is reached in two hops: the bounce still held block 2 from
        # the pull before, and a failed first hop is not followed by its
        # second.)
        assert not g1.any(), "no byte of the revoked block arrived"
        wait_ok(w.transfer_from_instance(PREFILL, Tier.G2, [3], Tier.G1, [3]))
        bb = CFG.block_bytes
        np.testing.assert_array_equal(g1[3 * bb:4 * bb], pattern(5)[3 * bb:4 * bb])
        w.disconnect_remote(PREFILL)


def test_revoke_blocks_refuses_bad_blocks_whole():
    with Worker(new_worker_id()) as w:
        w.allocate_g2(CFG)
        w.revoke_blocks({Tier.G2: [0, 1]})
        with pytest.raises(kvbmgo.errors.InvalidArgumentError):
            w.revoke_blocks({})
        with pytest.raises(kvbmgo.errors.OutOfRangeError):
            w.revoke_blocks({Tier.G2: [1, NB]})
        with pytest.raises(kvbmgo.errors.NotFoundError):
            w.revoke_blocks({Tier.G1: [0]})
        with pytest.raises(kvbmgo.errors.InvalidArgumentError):
            w.revoke_blocks({7: [0]})


def test_block_scoped_export_refuses_bad_scopes():
    with Worker(new_worker_id()) as w:
        w.allocate_g2(CFG)
        md = w.export_metadata(blocks={Tier.G2: np.array([1, 2], dtype=np.uint32)})
        assert kvbmgo.Worker.exporter_id(md) == w.worker_id
        with pytest.raises(kvbmgo.errors.InvalidArgumentError):
            w.export_metadata(blocks={})
        with pytest.raises(kvbmgo.errors.InvalidArgumentError):
            w.export_metadata(blocks={Tier.G2: [1]}, expires=0)
        with pytest.raises(kvbmgo.errors.OutOfRangeError):
            w.export_metadata(blocks={Tier.G2: [NB]})
        with pytest.raises(kvbmgo.errors.NotFoundError):
            w.export_metadata(blocks={Tier.G1: [0]})
        with pytest.raises(ValueError, match="expires scopes blocks"):
            w.export_metadata(expires=5)


def test_killed_prefill_fails_every_block_then_a_new_one_is_reached(prefill):
    w, g1 = decode_worker(20.0)
    with w:
        w.connect_remote(PREFILL, prefill.metadata)
        prefill.stop()
        n = w.transfer_from_instance(PREFILL, Tier.G2, IDS, Tier.G1, IDS)
        start = time.monotonic()
        prefill.proc.kill()
        with n:
            with pytest.raises(KvbmIOError, match="peer"):
                n.wait(30.0)
            assert n.failed_blocks() == IDS
        assert time.monotonic() - start < 10.0  # the reset is seen at once, not at the deadline

        again = Prefill()
        try:
            w.connect_remote(PREFILL, again.metadata)
            wait_ok(w.transfer_from_instance(PREFILL, Tier.G2, IDS, Tier.G1, IDS))
            np.testing.assert_array_equal(g1, pattern(5))
        finally:
            again.close()


def test_frozen_prefill_fails_within_the_deadline(prefill):
    w, _ = decode_worker(0.5)
    with w:
        w.connect_remote(PREFILL, prefill.metadata)
        prefill.stop()
        start = time.monotonic()
        n = w.transfer_from_instance(PREFILL, Tier.G2, IDS, Tier.G1, IDS)
        with n:
            with pytest.raises(KvbmIOError, match="did not answer within the deadline"):
                n.wait(30.0)
            elapsed = time.monotonic() - start
            assert n.failed_blocks() == IDS
        assert 0.5 <= elapsed < 2.5


def test_remote_deadline_is_checked():
    with pytest.raises(kvbmgo.errors.InvalidArgumentError, match="remote_deadline"):
        Worker(new_worker_id(), remote_deadline=0)


@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_cancel_or_deadline_stops_a_pull_and_keeps_the_peer(prefill, how):
    from kvbmgo.errors import CanceledError, DeadlineExceededError
    w, g1 = decode_worker(10.0)
    with w:
        w.connect_remote(PREFILL, prefill.metadata)
        prefill.stop()  # the pull cannot complete
        start = time.monotonic()
        n = w.transfer_from_instance(PREFILL, Tier.G2, IDS, Tier.G1, IDS,
                                     deadline=0.3 if how == "deadline" else None)
        if how == "cancel":
            time.sleep(0.1)
            n.cancel()
        with n:
            with pytest.raises(CanceledError) as raised:
                n.wait(30.0)
            # A deadline is told from a cancel by its status, not a clock.
            assert isinstance(raised.value, DeadlineExceededError) == (how == "deadline")
            assert n.failed_blocks() == IDS
        assert time.monotonic() - start < 5.0, "well before the 10 s remote deadline"
        prefill.proc.send_signal(signal.SIGCONT)
        time.sleep(0.1)
        assert not g1.any(), "nothing lands after the transfer completed"
        # The peer was not at fault: the next pull works without reconnecting.
        wait_ok(w.transfer_from_instance(PREFILL, Tier.G2, IDS, Tier.G1, IDS))
        np.testing.assert_array_equal(g1, pattern(5))


def test_disconnect_remote_forgets_the_instance(prefill):
    from kvbmgo.errors import NotFoundError
    w, g1 = decode_worker(10.0)
    with w:
        w.connect_remote(PREFILL, prefill.metadata)
        wait_ok(w.transfer_from_instance(PREFILL, Tier.G2, IDS, Tier.G1, IDS))
        w.disconnect_remote(PREFILL)
        with pytest.raises(NotFoundError):
            w.transfer_from_instance(PREFILL, Tier.G2, IDS, Tier.G1, IDS)
        with pytest.raises(NotFoundError):
            w.disconnect_remote(PREFILL)
        g1[:] = 0
        w.connect_remote(PREFILL, prefill.metadata)
        wait_ok(w.transfer_from_instance(PREFILL, Tier.G2, IDS, Tier.G1, IDS))
        np.testing.assert_array_equal(g1, pattern(5))
