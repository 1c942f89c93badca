"""The kvbm PD backend's control messages under attack with nothing
configured (no KVBM_AUTH_KEY): the managers use the same-host key
(kvbmgo._control.choose_key), and a peer with network reach but without it
gets nothing: no metadata, no prefill token, no room data, and its forged
hand-over changes nothing. A message signed for one prefill never verifies
at another. Across hosts a manager without a key refuses to start, unless
the operator opted out (KVBM_PD_ALLOW_UNAUTHENTICATED=1, warned at every
start)."""
import logging
import time

import pytest

from hicache_harness import require_sglang

require_sglang()

import numpy as np  # noqa: E402

import pd_harness as h  # noqa: E402
import test_pd as base  # noqa: E402
from pd_harness import AUX_ITEM_LENS, Side, wait_for  # noqa: E402
from test_pd import Attacker, finish_genuine, started  # noqa: E402

from sglang.srt.disaggregation.base import KVPoll  # noqa: E402

from kvbmgo import _control  # noqa: E402
from kvbmgo.sglang import pd_wire as wire  # noqa: E402

# test_pd's fixtures: a bootstrap server with a prefill and a decode manager.
server_args = base.server_args
pair = base.pair

ENV = (_control.ENV_KEY, _control.ENV_KEY_FILE, _control.ENV_UNAUTHENTICATED)
WRONG = b"a-wrong-key-of-the-same-length-000000000"


@pytest.fixture(autouse=True)
def unconfigured(monkeypatch):
    """Nothing configured (the default), whatever the environment says."""
    for v in ENV:
        monkeypatch.delenv(v, raising=False)


def settle(p, prefill=0, decode=0):
    """Waits until the managers refused at least that many messages."""
    t0 = time.monotonic()
    while sum(p.pm.auth.refused.values()) < prefill or sum(p.dm.auth.refused.values()) < decode:
        assert time.monotonic() - t0 < 5, (p.pm.auth.refused, p.dm.auth.refused)
        time.sleep(0.02)


def test_nothing_configured_is_the_same_host_key(pair):
    p = pair()
    key, _ = _control.same_host_key()
    assert p.pm.auth.key == p.dm.auth.key == key
    assert p.pm.key_choice.how == _control.SAME_HOST
    assert p.pm.auth.me == f"127.0.0.1:{p.pm.rank_port}"
    src, dst = [3, 7, 1, 9], [10, 2, 5, 0]
    sender, recv = started(p, 3100, dst, 6)
    finish_genuine(p, sender, recv, src, dst, 3, 6)
    assert p.pm.auth.refused == {} and p.dm.auth.refused == {}


@pytest.mark.parametrize("key", [None, WRONG], ids=["unsigned", "wrong-key"])
def test_an_unauthenticated_registration_gets_nothing(pair, key):
    """KVBM_REG without the key: no KVBM_META (metadata, the prefill's
    token) reaches the endpoint it names; it is not registered."""
    p = pair()
    a = Attacker(key)
    try:
        pm = p.pm
        a.push(pm.rank_port, wire.registration("127.0.0.1", a.port, a.token, pm.signature, "n"))
        settle(p, prefill=1)
        assert a.received(0.5) == [], "the attacker got an answer"
        assert a.token not in pm.decode_kv_args_table
        assert set(pm.auth.refused) == {"unauthenticated" if key is None else "bad mac"}
    finally:
        a.close()


@pytest.mark.parametrize("key", [None, WRONG], ids=["unsigned", "wrong-key"])
def test_registering_first_for_a_known_room_gets_nothing(pair, key):
    """The attacker registers and reserves a room before its decode does:
    it is not the room's decode, gets none of the room's page indices or its
    aux row, and the genuine decode's request completes."""
    p = pair()
    a = Attacker(key)
    room = 3200
    try:
        pm = p.pm
        sender = p.sender(room)
        a.push(pm.rank_port, wire.registration("127.0.0.1", a.port, a.token, pm.signature, "n"))
        a.push(pm.rank_port, wire.TransferInfo(room=room, endpoint="127.0.0.1", dst_port=a.port,
                                               peer=a.token, num_pages=3,
                                               required_dst_info_num=1, decode_prefix_len=0,
                                               is_dummy=False).frames())
        settle(p, prefill=2)
        assert room not in pm.transfer_infos and sender.poll() == KVPoll.Bootstrapping
        recv = p.receiver(room)
        dst, src = [4, 1, 6], [2, 8, 5]
        recv.send_metadata(np.array(dst, np.int32), 3, [], decode_prefix_len=0)
        wait_for(sender.poll, KVPoll.WaitingForInput, 10, "prefill")
        assert list(pm.transfer_infos[room]) == [p.dm.token]
        finish_genuine(p, sender, recv, src, dst, 1, 3)
        assert a.received(0.5) == [], "the attacker got the room's data"
    finally:
        a.close()


@pytest.mark.parametrize("key", [None, WRONG], ids=["unsigned", "wrong-key"])
def test_a_forged_pull_naming_the_prefills_token_is_refused(pair, key):
    """A KVBM_PULL naming the genuine prefill's token (as a KVBM_META would
    have leaked it), other pages and a chosen first token: refused; the
    decode pulls nothing, writes no aux row, and the room does not end in
    Success until the genuine prefill hands it over."""
    p = pair()
    a = Attacker(key)
    room = 3300
    try:
        dst, src = [1, 3, 4], [6, 2, 8]
        sender, recv = started(p, room, dst, 2)
        a.push(p.dm.rank_port, wire.pull(room, p.pm.token, 0, 0, np.array([0, 2, 4], np.int32),
                                         True, [], [b"\xee" * n for n in AUX_ITEM_LENS]))
        settle(p, decode=1)
        time.sleep(0.3)
        assert recv.poll() == KVPoll.WaitingForInput
        assert not p.D.kv_any() and not any(x.any() for x in p.D.aux)
        finish_genuine(p, sender, recv, src, dst, 0, 2)
    finally:
        a.close()


def test_a_message_to_one_prefill_replayed_to_another_is_refused(pair):
    """The genuine decode's KVBM_REG and KVBM_ROOM to one prefill, captured
    and replayed (within the window, the same key) to another prefill and
    to the first: refused as signed for another receiver, and as replays."""
    p, q = pair(), pair()
    sent = []
    sign = p.dm.auth.sign

    def capture(frames, to, nonce=None):
        out = sign(frames, to, nonce)
        sent.append((to, list(out)))
        return out
    p.dm.auth.sign = capture
    sender, recv = started(p, 3400, [1, 2], 0)
    to_p = _control.endpoint("127.0.0.1", p.pm.rank_port)
    msgs = [m for to, m in sent if to == to_p and m[0] in (wire.TAG_REG, wire.TAG_ROOM)]
    assert [m[0] for m in msgs] == [wire.TAG_REG, wire.TAG_ROOM]
    a = Attacker(None)
    try:
        for m in msgs:
            a.push(q.pm.rank_port, m, sign=False)
            a.push(p.pm.rank_port, m, sign=False)
        settle(q, prefill=2)
        settle(p, prefill=2)
        assert q.pm.auth.refused == {"wrong receiver": 2}
        assert p.pm.auth.refused == {"replay": 2}
        assert p.dm.token not in q.pm.decode_kv_args_table and 3400 not in q.pm.transfer_infos
    finally:
        a.close()
    finish_genuine(p, sender, recv, [5, 6], [1, 2], 3, 0)


def test_no_key_on_a_non_loopback_address_refuses_to_start(server_args, monkeypatch):
    monkeypatch.setenv("SGLANG_HOST_IP", "0.0.0.0")
    for mode in ("prefill", "decode"):
        with pytest.raises(ValueError) as e:
            h.manager(Side(4), mode, server_args)
        for v in ENV:
            assert v in str(e.value), str(e.value)
        assert "0.0.0.0" in str(e.value)


def test_the_opt_out_is_unauthenticated_and_warns_at_every_start(server_args, monkeypatch,
                                                                caplog):
    monkeypatch.setenv("SGLANG_HOST_IP", "0.0.0.0")
    monkeypatch.setenv(_control.ENV_UNAUTHENTICATED, "1")
    with caplog.at_level(logging.WARNING, logger="kvbmgo._control"):
        sides = [Side(4), Side(4)]  # alive while their managers are
        made = [h.manager(x, "decode", server_args) for x in sides]
        try:
            assert made[0].local_ip == "0.0.0.0" and not made[0].auth.enabled
        finally:
            for m in made:
                m.close()
    lines = [r.getMessage() for r in caplog.records if _control.ENV_UNAUTHENTICATED in
             r.getMessage()]
    assert len(lines) == 2 and all("unauthenticated" in m and _control.ENV_KEY in m
                                   and "0.0.0.0" in m for m in lines), lines
