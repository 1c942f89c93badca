"""The vLLM P/D side channel's key (kvbmgo._control.choose_key) and MAC,
under attack: real kv_producer and kv_consumer engines (or the prefill's
side channel alone) and a peer with network reach speaking to it with
pyzmq. With no configuration the engines use the same-host key; a message
without it is answered only with why and acted on in nothing; a message
signed for one prefill never verifies at another; a lease is the
prefill's, whatever a pull asks."""
import json
import logging
import time

from harness import require_vllm

require_vllm()

import pytest  # noqa: E402
import zmq  # noqa: E402

import side_channel  # noqa: E402
from harness import Engine  # noqa: E402
from test_disagg import PROMPT, decode_engine, free_port, prefill, prefill_engine  # noqa: E402
from test_disagg_trust import held_R, port_of, pulls_byte_for_byte, server  # noqa: E402

from kvbmgo import _control  # noqa: E402
from kvbmgo.vllm import pd_wire as wire  # noqa: E402
from kvbmgo.vllm.pd_prefill import PrefillServer  # noqa: E402

KEY = b"kvbm-test-deployment-key-0123456789abcdef"
ENV = (_control.ENV_KEY, _control.ENV_KEY_FILE, _control.ENV_UNAUTHENTICATED)


@pytest.fixture(autouse=True)
def unconfigured(monkeypatch):
    """Nothing configured (the default), whatever the environment says."""
    for v in ENV:
        monkeypatch.delenv(v, raising=False)


@pytest.fixture
def pd():
    p, d = prefill_engine(), decode_engine()
    yield p, d
    d.close()
    p.close()


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def _refusal(frames):
    assert frames is not None and len(frames) == 1, frames  # no metadata
    head = json.loads(frames[0])
    assert head["ok"] is False and "not authenticated" in head["why"], head
    assert _control.ENV_KEY in head["why"]
    return head


def test_no_configuration_on_loopback_is_the_same_host_key(pd):
    p, d = pd
    key, _ = _control.same_host_key()
    params, want = held_R(p)
    assert server(p)._auth.key == key
    pulls_byte_for_byte(p, d, params, want)
    assert d.worker._worker._puller._auth.key == key
    assert d.worker._worker._key.how == _control.SAME_HOST


def test_messages_without_the_key_are_refused_and_act_on_nothing(pd, zctx):
    """Unsigned, or under another key, a pull with the request's own token
    gets no metadata and no lease, and a done with it releases nothing: the
    answer says why (naming KVBM_AUTH_KEY) and nothing else."""
    p, d = pd
    params, want = held_R(p)
    port = port_of(p)
    srv = server(p)
    pull = {"op": "pull", "req": "R", "engine": "prefill-engine", "lease_s": 5,
            "token": params["kvbm_token"]}
    done = {"op": "done", "req": "R", "engine": "prefill-engine",
            "token": params["kvbm_token"]}
    for key in (None, b"another-key-of-a-deployment-0123456789"):
        for h in (pull, done):
            frames = side_channel.ask(zctx, port, h, key=key)
            _refusal(frames)
            assert not any(srv._md in f for f in frames)
    # Unsigned but shaped like a signed one (a forged tag and MAC): refused too.
    forged, _ = side_channel.signed(pull, port)
    forged[-1] = b"\0" * 32
    _refusal(side_channel.exchange(zctx, port, forged))
    assert srv._auth.refused == {"unauthenticated": 2, "bad mac": 3}
    assert not srv._held["R"].leases, "an unauthenticated pull got a lease"
    for _ in range(3):
        p.step()
    assert srv.held() == {"R"} and not any(o.finished_sending for o in p.outputs)
    pulls_byte_for_byte(p, d, params, want)


def _two_prefills(key, **kw):
    """Two prefill ranks' side channels, the same key and engine id, holding
    the same request under the same token (one restarted, or another rank)."""
    choice = _control.KeyChoice(key, _control.EXPLICIT, "test")
    out = []
    for _ in range(2):
        port = free_port()
        srv = PrefillServer(b"metadata", "E", "127.0.0.1", port, 60.0, key=choice, **kw)
        srv.hold("R", "T" * 32)
        out.append((srv, port))
    return out


def test_a_message_to_one_prefill_replayed_to_another_is_refused(zctx):
    (a, pa), (b, pb) = _two_prefills(KEY)
    try:
        pull = {"op": "pull", "req": "R", "engine": "E", "token": "T" * 32, "lease_s": 5}
        frames, nonce = side_channel.signed(pull, pa, engine="E", key=KEY)
        # Captured on its way to a, replayed to b (within the window): refused.
        _refusal(side_channel.exchange(zctx, pb, list(frames)))
        assert b._auth.refused == {"wrong receiver": 1} and not b._held["R"].leases
        # The original reaches a; its replay to a is refused as well.
        got = side_channel.exchange(zctx, pa, list(frames))
        opened = wire.Auth(KEY, "d/0", "decode").open(got, me=wire.reply_to(nonce))
        assert opened is not None and json.loads(opened[0][0])["ok"]
        assert opened[0][1] == b"metadata"
        _refusal(side_channel.exchange(zctx, pa, list(frames)))
        assert a._auth.refused == {"replay": 1} and len(a._held["R"].leases) == 1
        # An answer names the ask it answers: another ask does not take it.
        other = wire.Auth(KEY, "d/0", "decode")
        assert other.open(got, me=wire.reply_to(_control.new_token())) is None
        assert other.refused == {"wrong receiver": 1}
    finally:
        a.close()
        b.close()


def test_a_forged_answer_is_not_taken_by_the_decode(pd, zctx):
    """An answer that is not signed for the decode's ask (a peer at the
    prefill's address without the key) is refused, even with the genuine
    prefill's metadata: the pull fails, nothing is written."""
    from test_disagg_trust import Attacker, _failed_closed, forged_params
    p, d = pd
    params, want = held_R(p)
    evil_port = free_port()
    attacker = Attacker(zctx, "127.0.0.1", evil_port, server(p)._md, key=None)
    try:
        d.add("F", [7] + PROMPT, kv_transfer_params=forged_params(params, "127.0.0.1",
                                                                   evil_port))
        d.step()
        ids = d.block_ids("F")[:3]
        d.run(timeout=10)
        _failed_closed(d, "F", ids)
        assert any(h.get("op") == "pull" for h in attacker.seen)
    finally:
        attacker.close()


def test_a_lease_is_the_holders():
    """lease_s=999999 is cut to the prefill's bound (min(pd_hold_s,
    pd_max_lease_s)), and so is the metadata's expiry; a lease never ends
    past the hold plus that bound."""
    expiries = []
    choice = _control.KeyChoice(KEY, _control.EXPLICIT, "test")
    ctx = zmq.Context()
    servers = []
    try:
        for hold_s, max_lease_s, bound in ((60.0, 20.0, 20.0), (30.0, None, 30.0),
                                           (30.0, 300.0, 30.0)):
            port = free_port()
            srv = PrefillServer(b"metadata", "E", "127.0.0.1", port, hold_s,
                                scoped=lambda ids, s: expiries.append(s) or b"scoped",
                                key=choice, max_lease_s=max_lease_s)
            servers.append(srv)
            srv.hold("R", "T" * 32, [1, 2])
            t0 = time.monotonic()
            got = side_channel.ask(ctx, port, {"op": "pull", "req": "R", "engine": "E",
                                               "token": "T" * 32, "lease_s": 999999},
                                   engine="E", key=KEY)
            head = json.loads(got[0])
            assert head["ok"] and head["lease_s"] == bound, head
            assert max(srv._held["R"].leases.values()) <= t0 + bound + 6
            assert expiries[-1] <= bound + 6
        # Asked again past its hold: no longer than the hold plus the bound.
        srv._held["R"].until = time.monotonic() - 25
        head = json.loads(side_channel.ask(ctx, port, {
            "op": "pull", "req": "R", "engine": "E", "token": "T" * 32, "lease_s": 999999},
            engine="E", key=KEY)[0])
        assert head["ok"] and head["lease_s"] <= 5.0, head
    finally:
        ctx.destroy(linger=0)
        for srv in servers:
            srv.close()


def test_an_engines_lease_is_bounded_by_pd_hold_s(zctx):
    p = Engine({"g2_blocks": 8, "pd_port": free_port(), "pd_hold_s": 30.0},
               role="kv_producer", engine_id="prefill-engine")
    try:
        _, params, _ = prefill(p)
        p.step()
        frames = side_channel.ask(zctx, port_of(p), {
            "op": "pull", "req": "R", "engine": "prefill-engine",
            "token": params["kvbm_token"], "lease_s": 999999})
        head = json.loads(frames[0])
        assert head["ok"] and head["lease_s"] == 30.0, head
    finally:
        p.close()


def test_no_key_across_hosts_refuses_to_start_naming_the_variables():
    for extra, role in (({"pd_host": "0.0.0.0"}, "kv_producer"),
                        ({"pd_host": "0.0.0.0"}, "kv_both"),
                        ({"pd_allow_hosts": ["10.0.0.0/8"]}, "kv_consumer")):
        with pytest.raises(ValueError) as e:
            Engine(dict(extra, g2_blocks=8, pd_port=free_port()), role=role,
                   engine_id="prefill-engine")
        for v in ENV:
            assert v in str(e.value), (role, str(e.value))


def test_a_decode_with_the_same_host_key_dials_no_other_host(caplog):
    """No key: a request naming a prefill on another host fails its blocks
    (the error names KVBM_AUTH_KEY); nothing is dialled."""
    p, d = prefill_engine(), decode_engine(timeout_s=2.0)
    try:
        _, params, _ = prefill(p)
        with caplog.at_level(logging.WARNING, logger="kvbmgo"):
            d.add("F", PROMPT, kv_transfer_params=dict(params, remote_host="192.0.2.1"))
            d.run(timeout=5)
        assert d.finished["F"].finish_reason.name == "ERROR"
        assert any("192.0.2.1" in r.getMessage() and _control.ENV_KEY in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
    finally:
        d.close()
        p.close()


def test_the_opt_out_runs_unauthenticated_with_a_warning_at_every_start(monkeypatch, zctx,
                                                                        caplog):
    monkeypatch.setenv(_control.ENV_UNAUTHENTICATED, "1")
    with caplog.at_level(logging.WARNING, logger="kvbmgo._control"):
        p = Engine({"g2_blocks": 8, "pd_port": free_port(), "pd_host": "0.0.0.0"},
                   role="kv_producer", engine_id="prefill-engine")
        d = decode_engine()
    try:
        lines = [r.getMessage() for r in caplog.records
                 if _control.ENV_UNAUTHENTICATED in r.getMessage()]
        assert len(lines) == 2 and all("unauthenticated" in m for m in lines), lines
        params, want = held_R(p)
        pulls_byte_for_byte(p, d, dict(params, remote_host="127.0.0.1"), want)
        # What it gives up: an unsigned message is taken.
        frames = side_channel.ask(zctx, port_of(p), {"op": "pull", "req": "nobody",
                                                     "engine": "prefill-engine",
                                                     "token": "0" * 32, "lease_s": 1},
                                  key=None)
        assert json.loads(frames[0]) == {"ok": False, "retry": True}
    finally:
        d.close()
        p.close()
