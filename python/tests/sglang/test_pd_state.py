"""The kvbm PD backend moves a hybrid model's state buffers (KVArgs.state_*,
filled by SGLang's own append_state_component) beside the KV pages and the
aux row: a Mamba slot and an SWA window handed over with every byte of every
state buffer checked against the prefill's and every other slot of the
decode untouched; a kind kvbm does not move, or a state missing or
mismatched, fails the room with the reason; a killed prefill fails it within
the heartbeat's bound (across processes)."""
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
from pd_harness import Side, free_port, mamba_indices, prefill_send, wait_for  # noqa: E402
from test_pd import Pair, check_bytes, failure  # noqa: E402

from sglang.srt.disaggregation.base import KVPoll  # noqa: E402
from sglang.srt.disaggregation.utils import KVClassType  # noqa: E402

from kvbmgo.sglang import plugin  # noqa: E402

PYTHON_DIR = str(Path(__file__).resolve().parents[2])
HERE = str(Path(__file__).resolve().parent)


@pytest.fixture(scope="module")
def server_args(tmp_path_factory):
    os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")
    return h.publish(str(tmp_path_factory.mktemp("model")), "prefill", free_port())


@pytest.fixture
def pair(server_args):
    made = []

    def make(**kw):
        p = Pair(server_args, **kw)
        made.append(p)
        return p
    yield make
    for p in made:
        p.close()


ONE_SLOT = ("mamba", "request_row")  # one slot a request; the others a page list


def state_of(kinds, one_slot, pages):
    """state_indices as prefill.py/decode.py build them, in kinds' order: a
    Mamba slot as a list holding a 0-d array, a request row as a 1-element
    array, pages (SWA window, block scales) as an array."""
    return [mamba_indices(one_slot) if k == "mamba" else
            np.array([one_slot], np.int32) if k == "request_row" else
            np.array(pages, np.int64) for k in kinds]


def check_states(P, D, src, dst):
    """Every byte of every state buffer's slots src[c] (component c) as the
    prefill had them in the decode's dst[c]; every other decode slot zero
    (the guard bytes around them)."""
    for c in range(len(P.state)):
        check_component(P, D, c, src[c], dst[c])


def check_component(P, D, c, src, dst):
    for b in range(len(P.state[c])):
        for s, d in zip(src, dst):
            assert np.array_equal(P.slot(c, b, s), D.slot(c, b, d)), \
                f"state {c} ({P.state_kinds[c]}) buffer {b}: slot {s} -> {d}"
        for d in set(range(len(D.state[c][b]))) - set(dst):
            assert not D.slot(c, b, d).any(), f"state {c} buffer {b}: slot {d} written"


def handover(p, room, kinds, src, dst, s_state, d_state, chunks=2, aux=(3, 6)):
    sender = p.sender(room)
    recv = p.receiver(room)
    recv.send_metadata(np.array(dst, np.int32), aux[1], state_of(kinds, *d_state),
                       decode_prefix_len=0)
    wait_for(sender.poll, KVPoll.WaitingForInput, 10, "prefill")
    prefill_send(sender, src, aux[0], chunks=chunks, state=state_of(kinds, *s_state))
    return sender, recv


@pytest.mark.parametrize("kinds", [("mamba",), ("swa",), ("mamba", "swa"),
                                   ("block_scale", "block_scale_swa", "request_row")],
                         ids=["kv+mamba", "kv+swa", "kv+mamba+swa", "kv+scales+row"])
def test_state_handed_over_every_byte(pair, kinds):
    """KV pages in two chunks, the state with the last: Success on both
    sides once every byte of the pages, the aux row and each state
    component's slots arrived; nothing else of the decode written."""
    p = pair(states=kinds)
    assert set(p.pm.state_workers) == set(range(len(kinds)))
    src, dst = [3, 7, 1, 9], [10, 2, 5, 0]
    s_state, d_state = (4, [2, 7, 8]), (1, [9, 0, 3])
    sender, recv = handover(p, 6100 + len(kinds), kinds, src, dst, s_state, d_state)
    wait_for(recv.poll, KVPoll.Success, 10, "decode")
    wait_for(sender.poll, KVPoll.Success, 10, "prefill")
    check_bytes(p, src, dst, 3, 6)
    src_slots = [[s_state[0]] if k in ONE_SLOT else s_state[1] for k in kinds]
    dst_slots = [[d_state[0]] if k in ONE_SLOT else d_state[1] for k in kinds]
    check_states(p.P, p.D, src_slots, dst_slots)
    recv.clear()
    sender.clear()


def test_a_stale_state_is_caught_by_the_byte_check(pair, monkeypatch):
    """A break that leaves the decode's Mamba slot and SWA pages as an
    earlier request wrote them (the state pull skipped) still reports
    Success; the byte check sees the stale state."""
    from kvbmgo.sglang.pd_decode import DecodeSide
    kinds = ("mamba", "swa")
    p = pair(states=kinds)
    for c, slots in ((0, [1]), (1, [9, 0])):  # an earlier request's bytes in the slots
        for b in range(len(p.D.state[c])):
            for d in slots:
                p.D.slot(c, b, d)[:] = 0x5A
    monkeypatch.setattr(DecodeSide, "pull_states", lambda self, r: None)
    sender, recv = handover(p, 6150, kinds, [3, 7], [1, 2], (4, [2, 7]), (1, [9, 0]))
    wait_for(recv.poll, KVPoll.Success, 10, "decode")
    check_bytes(p, [3, 7], [1, 2], 3, 6)  # the pages and aux came
    with pytest.raises(AssertionError, match="state 0 \\(mamba\\) buffer 0: slot 4 -> 1"):
        check_component(p.P, p.D, 0, [4], [1])
    with pytest.raises(AssertionError, match="state 1 \\(swa\\) buffer 0: slot 2 -> 9"):
        check_component(p.P, p.D, 1, [2, 7], [9, 0])


@pytest.mark.parametrize("case", ["missing", "count", "two mamba slots", "unmoved kind"])
def test_a_state_that_cannot_move_fails_the_room(pair, case):
    """The prefill sends no Mamba slot where the decode reserved one, an SWA
    window of another length, two Mamba slots, or slots of a kind kvbm does
    not move (DSA): the room fails with the reason on both sides, its
    decode state slots never written."""
    kinds = ("dsa",) if case == "unmoved kind" else ("mamba", "swa")
    p = pair(states=kinds)
    room = 6300
    sender = p.sender(room)
    recv = p.receiver(room)
    d_state = [np.array([], np.int64)] if case == "unmoved kind" else state_of(kinds, 1, [9, 0])
    recv.send_metadata(np.array([1, 2], np.int32), 6, d_state, decode_prefix_len=0)
    if case == "unmoved kind":
        # The decode has none to reserve; the prefill's slots refuse the room.
        assert p.pm.state_workers == {} and p.dm.state_workers == {}
    wait_for(sender.poll, KVPoll.WaitingForInput, 10, "prefill")
    s_state = {"missing": [None, np.array([2, 7])],
               "count": state_of(kinds, 4, [2, 7, 8]),
               "two mamba slots": [np.array([4, 5]), np.array([2, 7])],
               "unmoved kind": [np.array([2, 3])]}[case]
    prefill_send(sender, [3, 7], 3, state=s_state)
    wait_for(recv.poll, {KVPoll.Failed}, 10, "decode")
    wait_for(sender.poll, {KVPoll.Failed}, 10, "prefill")
    want = {"missing": "state 0 (mamba): the prefill sent 0 slots, this decode reserved 1",
            "count": "state 1 (swa): the prefill sent 3 slots, this decode reserved 2",
            "two mamba slots": "state 0 (mamba) needs one slot a request, got 2",
            "unmoved kind": "state 0 (dsa) cannot be transferred"}[case]
    assert want in failure(sender if case in ("two mamba slots", "unmoved kind") else recv)
    assert not p.D.state_any() and not any(a.any() for a in p.D.aux)


def test_a_refused_kind_on_the_decode_fails_at_once(pair):
    """The decode names slots of a kind kvbm does not move: its room fails
    at send_metadata with the reason, and tells the prefill (SGLang's
    ABORT), which fails at once instead of after its bootstrap timeout."""
    p = pair(states=("dsa",))
    room = 6350
    sender = p.sender(room)
    recv = p.receiver(room)
    recv.send_metadata(np.array([1, 2], np.int32), 0, [np.array([4])], decode_prefix_len=0)
    assert recv.poll() == KVPoll.Failed
    assert "state 0 (dsa) cannot be transferred" in failure(recv)
    wait_for(sender.poll, {KVPoll.Failed}, 3, "prefill")
    assert "bort" in failure(sender)


def test_state_buffers_with_another_tp_are_refused(pair):
    """A state slot is one rank's shard: a decode with state buffers and
    another attention TP than its prefill fails the room at init, even for
    an MLA model (whose KV alone could come from one prefill rank)."""
    p = pair(states=("mamba",), mla=True)
    p.dm.attn_tp_size = 2
    room = 6360
    sender = p.sender(room)
    recv = p.receiver(room)
    assert recv.poll() == KVPoll.Failed
    assert "different attention TP sizes with state buffers" in failure(recv)
    # The prefill is told (SGLang's ABORT) and fails at once, not after its
    # bootstrap timeout.
    wait_for(sender.poll, {KVPoll.Failed}, 3, "prefill")
    assert "bort" in failure(sender)


def test_state_slots_are_scoped_and_revoked_before_the_status_is_final(pair, monkeypatch):
    """The last KVBM_PULL carries each state component's slots and its
    workers' metadata; when the room ends the prefill revokes those slots
    on each state worker before its status is final (SGLang then frees
    them), as it revokes the pages."""
    from kvbmgo import Tier, Worker
    from kvbmgo.sglang import pd_wire as wire
    from kvbmgo.sglang.pd_decode import DecodeSide
    kinds = ("mamba", "swa")
    room = 6400
    pulls = []
    orig = DecodeSide.on_message

    def on_message(self, msg, sender=None):
        if msg[0] == wire.TAG_PULL:
            pulls.append(wire.pull_states(msg))
        orig(self, msg, sender)
    monkeypatch.setattr(DecodeSide, "on_message", on_message)  # before the manager's loop
    p = pair(states=kinds)
    revoked = {}
    real = Worker.revoke_blocks

    def spy(w, blocks):
        for c, ws in p.pm.state_workers.items():
            if w in ws:
                revoked.setdefault(c, []).append((sorted(blocks[Tier.G1]),
                                                  p.pm.request_status.get(room)))
        real(w, blocks)
    monkeypatch.setattr(Worker, "revoke_blocks", spy)
    sender, recv = handover(p, room, kinds, [3, 7], [1, 2], (4, [7, 2]), (1, [9, 0]))
    wait_for(recv.poll, KVPoll.Success, 10, "decode")
    wait_for(sender.poll, KVPoll.Success, 10, "prefill")
    assert pulls[0] == [] and [(c, s.tolist(), len(m)) for c, s, m in pulls[-1]] == \
        [(0, [4], len(p.pm.state_workers[0])), (1, [7, 2], len(p.pm.state_workers[1]))]
    assert {c: [ids for ids, _ in r] for c, r in revoked.items()} == \
        {0: [[4]] * len(p.pm.state_workers[0]), 1: [[2, 7]] * len(p.pm.state_workers[1])}
    assert all(s not in (KVPoll.Success, KVPoll.Failed) for r in revoked.values()
               for _, s in r)


@pytest.fixture
def prefill_proc(tmp_path):
    import kvbmgo
    if getattr(kvbmgo.info(), "transport", "loopback") in (None, "loopback"):
        pytest.skip("no transport between processes")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYTHON_DIR, HERE]),
               SGLANG_HOST_IP="127.0.0.1", SGLANG_DISAGGREGATION_WAITING_TIMEOUT="60")
    log = open(tmp_path / "stderr.log", "w")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "pd_state_prefill.py"),
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


def test_two_processes_state_every_byte_then_killed_prefill(prefill_proc, server_args,
                                                            monkeypatch):
    """The prefill in its own process: room A's pages, aux row, Mamba slot
    and SWA window cross kvbm's transport, every byte checked, every other
    decode slot untouched, and the state metadata A's decode got reads
    nothing once A ended (revoked), nor any other slot; then the prefill is
    killed (SIGKILL) after room B's first chunk, before its state: B fails
    within the heartbeat's bound (well before the waiting timeout), B's
    state slots never written."""
    import pd_state_prefill as sp
    from kvbmgo import Tier
    from kvbmgo.errors import UnsupportedError
    from kvbmgo.sglang import pd_wire as wire
    from kvbmgo.sglang.pd_decode import DecodeSide
    proc, port = prefill_proc
    got = {}
    orig = DecodeSide.on_message

    def on_message(self, msg, sender=None):
        if msg[0] == wire.TAG_PULL and int(msg[1]) == sp.ROOM_A:
            got.setdefault("a", []).extend(wire.pull_states(msg))
        orig(self, msg, sender)
    monkeypatch.setattr(DecodeSide, "on_message", on_message)  # before the manager's loop
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "60")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "2")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "1")
    assert proc.event() == {"event": "ready"}
    D, E = Side(16, states=sp.KINDS), Side(16, states=sp.KINDS)
    dm = h.manager(D, "decode", server_args)
    thief = h.manager(E, "decode", server_args)  # a worker A's metadata leaked to
    try:
        addr = f"127.0.0.1:{port}"
        t0 = time.monotonic()
        while not dm.try_ensure_parallel_info(addr):
            assert time.monotonic() - t0 < 30
            time.sleep(0.05)

        def receiver(room, dst, aux, mamba, swa):
            r = plugin.kv_class(KVClassType.RECEIVER)(dm, addr, room)
            r.init(0)
            r.send_metadata(np.array(dst, np.int32), aux, state_of(sp.KINDS, mamba, swa),
                            decode_prefix_len=0)
            return r
        a_dst, a_mamba, a_swa = [0, 6, 2, 9], 5, [8, 3]
        a = receiver(sp.ROOM_A, a_dst, 4, a_mamba, a_swa)
        wait_for(a.poll, KVPoll.Success, 30, "decode A")
        assert proc.event() == {"event": "done A", "state": int(KVPoll.Success)}
        P = Side(sp.PAGES, seed=sp.SEED, states=sp.KINDS)  # the subprocess's bytes
        for b in range(len(P.kv)):
            for s, d in zip(sp.A_SRC, a_dst):
                assert np.array_equal(P.page(b, s), D.page(b, d)), (b, s, d)
        for i in range(len(h.AUX_ITEM_LENS)):
            assert np.array_equal(P.aux[i][1], D.aux[i][4]), i
        check_states(P, D, [[sp.A_MAMBA], sp.A_SWA], [[a_mamba], a_swa])
        a.clear()
        # A leaked copy of A's Mamba metadata (the temporal group's), after A ended.
        (mamba,) = [mds for c, _, mds in got["a"] if c == 0]
        w = thief.state_workers[0][0]
        w.connect_remote(0xA0, mamba[0])
        for slot, why in ((sp.A_MAMBA, "revoked"), (sp.B_MAMBA, "request-scoped|revoked")):
            n = w.transfer_from_instance(0xA0, Tier.G1, [slot], Tier.G1, [0])
            with pytest.raises(UnsupportedError, match=why):
                n.wait(10)
            n.close()
        assert not E.state_any()
        states = [[b.copy() for b in bufs] for bufs in D.state]

        b_dst = [10, 11, 12, 13]
        b = receiver(sp.ROOM_B, b_dst, 5, 1, [0, 1])
        assert proc.event() == {"event": "B first chunk"}
        t0 = time.monotonic()  # the decode pulls B's first chunk; the kill comes after
        while not all(np.array_equal(P.page(x, s), D.page(x, d)) for x in range(len(P.kv))
                      for s, d in zip(sp.B_SRC[:2], b_dst[:2])):
            assert time.monotonic() - t0 < 10, "B's first chunk never arrived"
            time.sleep(0.01)
        proc.kill()
        proc.wait(10)
        _, took = wait_for(b.poll, {KVPoll.Failed}, 10, "decode B after the kill")
        assert took < 6.5, took
        assert "Lost connection with prefill" in failure(b)
        assert all(np.array_equal(x, y) for bufs, old in zip(D.state, states)
                   for x, y in zip(bufs, old)), "B's state slots were written"
        assert not any(a_.any() for a_ in (D.aux[i][5] for i in range(len(h.AUX_ITEM_LENS))))
        b.clear()
    finally:
        thief.close()
        dm.close()
