"""The kvbm PD backend's capabilities are request-scoped: a decode receives,
with each room's KVBM_PULLs, kvbm metadata that reads that room's pages only
(never whole-worker metadata at registration), and the prefill revokes it
when the room ends, before SGLang frees the pages for another request."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hicache_harness import require_sglang

require_sglang()

import numpy as np  # noqa: E402

import pd_harness as h  # noqa: E402
import pd_scope_prefill as sp  # noqa: E402
from pd_harness import Side, free_port, prefill_send, wait_for  # noqa: E402
from test_pd import Pair, started  # noqa: E402

from sglang.srt.disaggregation.base import KVPoll  # noqa: E402
from sglang.srt.disaggregation.utils import KVClassType  # noqa: E402

from kvbmgo import Tier, Worker  # noqa: E402
from kvbmgo.errors import UnsupportedError  # noqa: E402
from kvbmgo.sglang import plugin  # noqa: E402
from kvbmgo.sglang import pd_wire as wire  # noqa: E402
from kvbmgo.sglang.pd_decode import DecodeSide  # noqa: E402

PYTHON_DIR = str(Path(__file__).resolve().parents[2])
HERE = str(Path(__file__).resolve().parent)


@pytest.fixture(scope="module")
def server_args(tmp_path_factory):
    os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")
    return h.publish(str(tmp_path_factory.mktemp("model")), "prefill", free_port())


@pytest.fixture
def spied(monkeypatch):
    """Every control message a decode manager gets (after authentication),
    by tag; the KVBM_PULLs of the rooms in .hold are kept from it until
    .release(room)."""
    class Spy:
        frames, hold, held = [], set(), {}

        def release(self, room):
            self.hold.discard(room)
            for side, msg, sender in self.held.pop(room, []):
                orig(side, msg, sender)

    spy = Spy()
    orig = DecodeSide.on_message

    def on_message(self, msg, sender=None):
        spy.frames.append(list(msg))
        if msg[0] == wire.TAG_PULL and int(msg[1]) in spy.hold:
            spy.held.setdefault(int(msg[1]), []).append((self, msg, sender))
            return
        orig(self, msg, sender)
    monkeypatch.setattr(DecodeSide, "on_message", on_message)
    return spy


def pulls(spy, room):
    return [wire.parse_pull(m) for m in spy.frames
            if m[0] == wire.TAG_PULL and int(m[1]) == room]


@pytest.mark.parametrize("end", ["success", "decode abort", "prefill abort", "clear"])
def test_revoked_before_the_status_is_final(server_args, spied, monkeypatch, end):
    """Whatever ends a room on the prefill, its pages are revoked (each
    worker's G1 blocks the KVBM_PULLs covered) before its status is Success
    or Failed, which is when SGLang frees them; the registration's answer
    carries no metadata, each KVBM_PULL the metadata of its own pages."""
    p = Pair(server_args)
    try:
        revoked = []
        real = Worker.revoke_blocks

        def spy(w, blocks):
            if w in p.pm.workers:
                revoked.append((sorted(blocks[Tier.G1]), p.pm.request_status.get(room)))
            real(w, blocks)
        monkeypatch.setattr(Worker, "revoke_blocks", spy)
        room, src, dst = 4100, [6, 7, 8, 2], [1, 2, 3, 4]
        sender, recv = started(p, room, dst, 1)
        # The registration's answer reaches the decode's thread on its own
        # time (the prefill may be waiting for input first).
        deadline = time.monotonic() + 10
        while not any(m[0] == wire.TAG_META for m in list(spied.frames)) and \
                time.monotonic() < deadline:
            time.sleep(0.005)
        metas = [m for m in list(spied.frames) if m[0] == wire.TAG_META]
        assert metas and all(len(m) == 7 for m in metas), "KVBM_META carries no metadata"
        if end == "success":
            prefill_send(sender, src, 1)
            wait_for(recv.poll, KVPoll.Success, 10, "decode")
            wait_for(sender.poll, KVPoll.Success, 10, "prefill")
        else:
            sender.init(len(src), 1)
            sender.send(np.array(src[:2], np.int32), None, num_kv_tokens=2 * h.PAGE)
            t0 = time.monotonic()
            while not pulls(spied, room):
                assert time.monotonic() - t0 < 5
                time.sleep(0.01)
            if end == "decode abort":
                recv.abort()
                wait_for(sender.poll, {KVPoll.Failed}, 5, "prefill")
            elif end == "prefill abort":
                sender.abort()
            else:
                sender.clear()
        (_, _, start, pages, _, scopes, _), *_ = pulls(spied, room)
        assert start == 0 and [n for n, _ in scopes] == [len(pages)]
        assert all(len(mds) == len(p.pm.workers) for _, mds in scopes)
        want = sorted(src if end == "success" else src[:2])
        assert revoked and all(ids == want for ids, _ in revoked), revoked
        assert all(s not in (KVPoll.Success, KVPoll.Failed) for _, s in revoked), revoked
        assert p.pm.side.rooms.get(room) is None or p.pm.side.rooms[room].ended
    finally:
        p.close()


def test_a_page_two_rooms_share_is_revoked_when_the_last_ends(server_args, spied, monkeypatch):
    """The radix cache gives rooms A and B the same prefix pages: A ends,
    and only its own pages are revoked (B's decode still reads the shared
    ones, whose bytes stay while B runs); B ends: the rest."""
    p = Pair(server_args)
    try:
        revoked = []
        real = Worker.revoke_blocks

        def spy(w, blocks):
            if w in p.pm.workers:
                revoked.append(sorted(blocks[Tier.G1]))
            real(w, blocks)
        monkeypatch.setattr(Worker, "revoke_blocks", spy)
        a, b = 4200, 4201
        src = {a: [6, 7, 8, 2], b: [6, 7, 9, 3]}
        sa, ra = started(p, a, [1, 2, 3, 4], 1)
        sb, rb = started(p, b, [5, 6, 7, 8], 2)
        spied.hold.add(b)  # B's pages are given out, its decode does not pull yet
        prefill_send(sb, src[b], 2)
        t0 = time.monotonic()
        while len(spied.held.get(b, [])) < 2:
            assert time.monotonic() - t0 < 5
            time.sleep(0.01)
        prefill_send(sa, src[a], 1)
        wait_for(ra.poll, KVPoll.Success, 10, "decode A")
        wait_for(sa.poll, KVPoll.Success, 10, "prefill A")
        assert revoked == [[2, 8]] * len(p.pm.workers), revoked
        spied.release(b)
        wait_for(rb.poll, KVPoll.Success, 10, "decode B")
        wait_for(sb.poll, KVPoll.Success, 10, "prefill B")
        assert revoked[-1] == [3, 6, 7, 9], revoked
    finally:
        p.close()


def test_scope_pieces_bound_the_ranges():
    """A chunk's pages are split so that no piece's metadata names more
    ranges than a kvbm hello carries."""
    pages = np.arange(0, 20000, 2, dtype=np.int32)  # 10,000 runs of one page
    pieces = wire.scope_pieces(pages)
    assert [n for _, n in pieces] == [2048] * 4 + [10000 - 4 * 2048]
    assert sum(n for _, n in pieces) == len(pages)
    assert wire.scope_pieces(np.arange(5, 9000, dtype=np.int32)) == [(0, 8995)]
    assert wire.scope_pieces(np.array([], np.int32)) == []


@pytest.fixture
def prefill_proc(tmp_path):
    import kvbmgo
    if getattr(kvbmgo.info(), "transport", "loopback") in (None, "loopback"):
        pytest.skip("no transport between processes: the loopback enforces no scope")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYTHON_DIR, HERE]),
               SGLANG_HOST_IP="127.0.0.1", SGLANG_DISAGGREGATION_WAITING_TIMEOUT="60")
    log = open(tmp_path / "stderr.log", "w")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "pd_scope_prefill.py"),
                             str(port), str(tmp_path / "model")], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)

    def event():
        line = proc.stdout.readline()
        assert line, f"the prefill said nothing more: {(tmp_path / 'stderr.log').read_text()[-3000:]}"
        return json.loads(line)
    proc.event = event
    try:
        yield proc, port
    finally:
        log.close()
        proc.kill()
        proc.wait()


def test_a_rooms_metadata_reads_its_pages_only_and_dies_with_it(prefill_proc, server_args,
                                                                  spied, monkeypatch):
    """Across processes: a worker holding room A's metadata (what its
    decode got) reads A's pages, and not room B's (UnsupportedError); once
    A ended on the prefill, the same metadata reads nothing (revoked) and
    no byte of the pages' next owner arrives. The decode itself pulls both
    rooms through their own metadata, every byte checked."""
    proc, port = prefill_proc
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "60")
    assert proc.event() == {"event": "ready"}
    D, E = Side(16), Side(16)
    dm = h.manager(D, "decode", server_args)
    thief = h.manager(E, "decode", server_args)  # a worker A's metadata leaked to
    try:
        addr = f"127.0.0.1:{port}"
        t0 = time.monotonic()
        while not dm.try_ensure_parallel_info(addr):
            assert time.monotonic() - t0 < 30
            time.sleep(0.05)
        spied.hold.update({sp.ROOM_A, sp.ROOM_B})
        dsts = {sp.ROOM_A: [1, 2, 3, 4, 5], sp.ROOM_B: [10, 11, 12]}
        recvs = {}
        for room, aux in ((sp.ROOM_A, 4), (sp.ROOM_B, 5)):
            recvs[room] = plugin.kv_class(KVClassType.RECEIVER)(dm, addr, room)
            recvs[room].init(0)
            recvs[room].send_metadata(np.array(dsts[room], np.int32), aux, [],
                                      decode_prefix_len=0)
        assert proc.event() == {"event": "sent"}
        t0 = time.monotonic()
        while len(spied.held.get(sp.ROOM_A, [])) < 2 or not spied.held.get(sp.ROOM_B):
            assert time.monotonic() - t0 < 10, spied.held.keys()
            time.sleep(0.01)
        P = Side(sp.PAGES, seed=sp.SEED)  # the subprocess's bytes
        w = thief.workers[0]
        a_md = [(pages, scopes[0][1][0]) for _, _, _, pages, _, scopes, _ in
                pulls(spied, sp.ROOM_A)]
        for i, (pages, md) in enumerate(a_md):
            w.connect_remote(0xA0 + i, md)
        pages = list(a_md[0][0])
        n = w.transfer_from_instance(0xA0, Tier.G1, pages, Tier.G1, [1, 2, 3][:len(pages)])
        n.wait(10)
        n.close()
        for b in range(len(P.kv)):
            for s, d in zip(pages, [1, 2, 3]):
                assert np.array_equal(P.page(b, s), E.page(b, d)), (b, s, d)
        for inst in (0xA0, 0xA1):
            n = w.transfer_from_instance(inst, Tier.G1, sp.B_SRC, Tier.G1, [6, 7, 8])
            with pytest.raises(UnsupportedError, match="request-scoped capability"):
                n.wait(10)
            n.close()
        assert not any(E.page(b, d).any() for b in range(len(E.kv)) for d in (6, 7, 8))

        spied.release(sp.ROOM_A)
        wait_for(recvs[sp.ROOM_A].poll, KVPoll.Success, 30, "decode A")
        assert proc.event() == {"event": "reused", "state": int(KVPoll.Success)}
        for i, (pages, _) in enumerate(a_md):
            dst = [9, 10, 11][:len(pages)]
            n = w.transfer_from_instance(0xA0 + i, Tier.G1, list(pages), Tier.G1, dst)
            with pytest.raises(UnsupportedError, match="revoked"):
                n.wait(10)
            n.close()
            assert not any(E.page(b, d).any() for b in range(len(E.kv)) for d in dst)

        spied.release(sp.ROOM_B)
        wait_for(recvs[sp.ROOM_B].poll, KVPoll.Success, 30, "decode B")
        assert proc.event() == {"event": "done B", "state": int(KVPoll.Success)}
        for room, src in ((sp.ROOM_A, sp.A_SRC), (sp.ROOM_B, sp.B_SRC)):
            for b in range(len(P.kv)):
                for s, d in zip(src, dsts[room]):
                    assert np.array_equal(P.page(b, s), D.page(b, d)), (room, b, s, d)
        for r in recvs.values():
            r.clear()
        assert not dm.side.rooms
    finally:
        thief.close()
        dm.close()
