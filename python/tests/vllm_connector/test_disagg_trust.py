"""The vLLM P/D side channel under attack (issue 21, item 5): a real
kv_producer engine (scheduler + worker connector) and decode engine, and an
attacker with nothing but network reach, speaking to the side channel with
pyzmq (or a raw socket) directly."""
import json
import socket
import struct
import threading
import time

from harness import require_vllm

require_vllm()

import pytest  # noqa: E402
import torch  # noqa: E402
import zmq  # noqa: E402

import side_channel  # noqa: E402
from harness import LAYERS, Engine  # noqa: E402
from test_disagg import (PROMPT, decode_engine, free_port, prefill, prefill_engine,  # noqa: E402
                         run_both, snapshot)

NOTHING = {"ok": False, "retry": True}  # the answer to a request not held


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


def port_of(p):
    return p.vc.kv_transfer_config.kv_connector_extra_config["pd_port"]


def server(p):
    return p.worker._worker._server


def ask(ctx, port, header, timeout_ms=3000, engine="prefill-engine"):
    """One REQ/REP exchange with the side channel, signed under the engines'
    key (a member of the deployment without the request's token: what the
    token guards against) for engine's rank at port; the reply's frames
    (None: no answer)."""
    return side_channel.ask(ctx, port, header, timeout_ms, engine=engine)


def held_R(p):
    """Runs R's prefill; returns its kv_transfer_params and bytes, once the
    prefill worker holds it."""
    _, params, want = prefill(p)
    p.step()  # the worker learns it holds R
    assert server(p).held() == {"R"}
    return params, want


def pulls_byte_for_byte(p, d, params, want, req="R-decode"):
    """The genuine decode pulls R and gets exactly the prefill's bytes."""
    d.add(req, PROMPT, max_tokens=2, kv_transfer_params=params)
    seen = []

    def check(so):
        if req in so.num_scheduled_tokens and not seen:
            ids = d.block_ids(req)[:3]
            seen.append(ids)
            for i, b in enumerate(ids):
                for layer in range(len(LAYERS)):
                    assert torch.equal(d.read(b, layer), want[i][layer]), \
                        f"block {i} (decode G1 {b}) layer {layer}"
    run_both(p, d, before_forward=check)
    assert seen, "the decode request never ran"
    assert d.finished[req].finish_reason.name == "LENGTH"
    assert not set().union(*(o.invalid_block_ids for o in d.outputs))


def test_the_token_is_in_kv_transfer_params_and_differs_per_request(pd):
    p, _ = pd
    _, a, _ = prefill(p, "A", [1] + PROMPT)
    _, b, _ = prefill(p, "B", [2] + PROMPT)
    for params in (a, b):
        assert isinstance(params["kvbm_token"], str) and len(params["kvbm_token"]) == 32
        int(params["kvbm_token"], 16)  # 128 bits, hex
    assert a["kvbm_token"] != b["kvbm_token"]


def test_a_tokenless_or_forged_pull_gets_nothing(pd, zctx):
    p, d = pd
    params, want = held_R(p)
    port = port_of(p)
    md = server(p)._md
    forged = [
        {"op": "pull", "req": "R", "engine": "prefill-engine", "lease_s": 5},  # no token
        {"op": "pull", "req": "R", "engine": "prefill-engine", "lease_s": 5, "token": None},
        {"op": "pull", "req": "R", "engine": "prefill-engine", "lease_s": 5, "token": ""},
        {"op": "pull", "req": "R", "engine": "prefill-engine", "lease_s": 5,
         "token": "0" * 32},
        {"op": "pull", "req": "R", "engine": "prefill-engine", "lease_s": 5,
         "token": params["kvbm_token"][:-1] + "x"},
        {"op": "pull", "req": "R", "engine": "wrong-engine", "lease_s": 5,
         "token": params["kvbm_token"]},  # the token, but another engine id
        {"op": "pull", "req": "R", "lease_s": 5, "token": params["kvbm_token"]},
    ]
    unknown = ask(zctx, port, {"op": "pull", "req": "nobody", "engine": "prefill-engine",
                               "lease_s": 5, "token": "0" * 32})
    assert [json.loads(f) for f in unknown] == [NOTHING]
    for h in forged:
        frames = ask(zctx, port, h)
        assert frames is not None, h
        # The same answer as a request it does not hold: no metadata, no engine id.
        assert frames == unknown, (h, frames)
        assert not any(md in f for f in frames)
        assert not any(b"prefill-engine" in f for f in frames)
    junk = ask(zctx, port, b"\xff not json")
    assert len(junk) == 1 and json.loads(junk[0])["ok"] is False
    assert server(p).refused >= 5
    assert not server(p)._held["R"].leases, "a forged pull got a lease"
    pulls_byte_for_byte(p, d, params, want)


def test_a_tokenless_done_releases_nothing(pd, zctx):
    p, d = pd
    params, want = held_R(p)
    port = port_of(p)
    for token in (None, "", "0" * 32, params["kvbm_token"].upper()):
        h = {"op": "done", "req": "R", "engine": "prefill-engine"}
        if token is not None:
            h["token"] = token
        assert ask(zctx, port, h) is not None
    # With the token but naming another engine: not this engine's request either.
    ask(zctx, port, {"op": "done", "req": "R", "engine": "x", "token": params["kvbm_token"]})
    for _ in range(3):
        p.step()
    assert server(p).held() == {"R"}
    assert not any(o.finished_sending for o in p.outputs), "a forged done released R"
    pulls_byte_for_byte(p, d, params, want)
    assert [o.finished_sending for o in p.outputs if o.finished_sending] == [{"R"}]


def test_an_early_done_with_a_wrong_token_does_not_release_a_future_request(pd, zctx):
    p, d = pd
    port = port_of(p)
    # Before R exists: "done" for it, without a token and with guessed ones.
    for token in (None, "0" * 32, "f" * 32):
        h = {"op": "done", "req": "R", "engine": "prefill-engine"}
        if token is not None:
            h["token"] = token
        assert json.loads(ask(zctx, port, h)[0]) == {"ok": True}  # as for any request
    params, want = held_R(p)
    for _ in range(3):
        p.step()
    assert server(p).held() == {"R"}, "an early forged done released R when it was held"
    assert not any(o.finished_sending for o in p.outputs)
    pulls_byte_for_byte(p, d, params, want)


def test_an_early_done_with_the_token_still_releases(pd, zctx):
    # The genuine decode's abort that overtakes the prefill's own step.
    p, _ = pd
    srv = server(p)
    ask(zctx, port_of(p), {"op": "done", "req": "Q", "engine": "prefill-engine",
                           "token": "c" * 32})
    srv.hold("Q", "c" * 32)
    assert srv.take_released() == {"Q"} and srv.held() == set()


def _zmtp_req_greeting(sock):
    """A ZMTP 3.0 NULL-mechanism handshake as a REQ socket, on a raw TCP socket."""
    sock.sendall(b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00")
                 + b"\x00" + b"\x00" * 31)
    props = b"\x0bSocket-Type" + struct.pack(">I", 3) + b"REQ"
    body = b"\x05READY" + props
    sock.sendall(b"\x04" + bytes([len(body)]) + body)
    got = b""
    deadline = time.monotonic() + 5
    while len(got) < 64 + 2 and time.monotonic() < deadline:  # its greeting + READY
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    assert got[:1] == b"\xff", "no ZMTP greeting"


def test_an_oversized_frame_is_refused_without_being_read(pd, zctx):
    p, d = pd
    params, want = held_R(p)
    port = port_of(p)
    assert server(p)._sock.getsockopt(zmq.MAXMSGSIZE) == 64 << 10
    big = 48 << 20
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        _zmtp_req_greeting(s)
        # The empty delimiter frame, then the header of a 48 MiB frame and 1 MiB of it.
        s.sendall(b"\x01\x00" + b"\x02" + struct.pack(">Q", big))
        sent, closed = 0, False
        chunk = b"x" * (64 << 10)
        try:
            while sent < (1 << 20):
                s.sendall(chunk)
                sent += len(chunk)
            s.settimeout(3)
            closed = s.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            closed = True
        except socket.timeout:
            closed = False
        assert closed, "the side channel kept reading a 48 MiB frame"
    # pyzmq's way: the frame is never delivered, no answer comes, and the
    # side channel serves the genuine decode as before.
    assert ask(zctx, port, b"{" + b" " * big + b"}", timeout_ms=1500) is None
    pulls_byte_for_byte(p, d, params, want)


class Attacker:
    """A ROUTER that answers every pull with the given metadata (and records
    what reached it); key: the key it signs its answers with (by default the
    engines': a member of the deployment; None: unsigned)."""

    def __init__(self, ctx, host, port, metadata, key=side_channel.MEMBER):
        from kvbmgo import _control
        from kvbmgo.vllm import pd_wire as wire
        if key == side_channel.MEMBER:
            key = _control.same_host_key()[0]
        self.auth = wire.Auth(key, "prefill-engine", "prefill",
                              me=wire.prefill_name("prefill-engine", port))
        self.wire = wire
        self.seen = []
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(f"tcp://{host}:{port}")
        self.metadata = metadata
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.serve, daemon=True)
        self.t.start()

    def serve(self):
        while not self.stop.is_set():
            if not self.sock.poll(50):
                continue
            frames = self.sock.recv_multipart()
            h = json.loads(frames[2])  # [identity, b"", header, authentication frames]
            self.seen.append(h)
            reply = [json.dumps({"ok": True, "lease": "x"}).encode()]
            if h.get("op") == "pull":
                reply.append(self.metadata)
            if self.auth.key is not None:
                got, _ = self.auth.verify(frames[2:])
                reply = self.auth.sign(reply, self.wire.reply_to(got.nonce))
            self.sock.send_multipart(frames[:2] + reply)

    def close(self):
        self.stop.set()
        self.t.join()
        self.sock.close()


def forged_params(params, host, port, **kw):
    return dict(params, remote_host=host, remote_port=port, kvbm_token="e" * 32, **kw)


def _failed_closed(d, req, ids):
    failed = set().union(*(o.invalid_block_ids for o in d.outputs))
    assert set(ids) <= failed, "the forged pull's blocks were not failed"
    assert d.finished[req].finish_reason.name == "ERROR"


def test_pd_allow_hosts_refuses_a_forged_request_naming_another_host(zctx):
    p = prefill_engine()
    d = Engine({"g2_blocks": 8, "pd_timeout_s": 5.0, "pd_allow_hosts": ["127.0.0.1/32"]},
               role="kv_consumer", engine_id="decode-engine", policy="fail")
    attacker = None
    try:
        params, want = held_R(p)
        evil_port = free_port()
        attacker = Attacker(zctx, "127.0.0.2", evil_port, server(p)._md)
        d.add("F", [7] + PROMPT, kv_transfer_params=forged_params(params, "127.0.0.2",
                                                                   evil_port))
        d.step()
        ids = d.block_ids("F")[:3]
        d.run(timeout=5)
        _failed_closed(d, "F", ids)
        time.sleep(0.2)
        assert attacker.seen == [], "the decode dialled a host pd_allow_hosts does not allow"
        d.outputs = []
        pulls_byte_for_byte(p, d, params, want)  # 127.0.0.1 is allowed
    finally:
        if attacker:
            attacker.close()
        d.close()
        p.close()


def test_metadata_of_another_worker_is_refused(pd, zctx):
    """A forged request sends the decode to a side channel that answers with
    metadata of a worker that is not the engine id and rank it names: the
    pull fails its blocks; nothing is written to them."""
    import kvbmgo
    from kvbmgo.vllm.config import engine_worker_id
    p, d = pd
    params, want = held_R(p)
    other = kvbmgo.Worker(engine_worker_id("someone-else"))
    try:
        other.allocate_g2(kvbmgo.LayoutConfig(num_blocks=4, num_layers=1, outer_dim=1,
                                              page_size=16, inner_dim=8, dtype_width=2,
                                              layout="fully_contiguous"))
        md = other.export_metadata()
        evil_port = free_port()
        attacker = Attacker(zctx, "127.0.0.1", evil_port, md)
        try:
            d.add("F", [7] + PROMPT, kv_transfer_params=forged_params(params, "127.0.0.1",
                                                                       evil_port))
            d.step()
            ids = d.block_ids("F")[:3]
            d.run(timeout=10)
            _failed_closed(d, "F", ids)
            assert any(h.get("op") == "pull" for h in attacker.seen)
            for b in ids:  # not a wrong byte: nothing was written
                for layer in range(len(LAYERS)):
                    assert not d.read(b, layer).any()
        finally:
            attacker.close()
        d.outputs = []
        pulls_byte_for_byte(p, d, params, want)
    finally:
        other.close()


def test_a_forged_reply_for_the_genuine_worker_does_not_re_point_a_pull_in_flight():
    """Two metadata blobs claim one worker id: the second waits while a pull
    uses the first, so a transfer always runs against the metadata it got."""
    from kvbmgo.vllm.pd_connections import Connections as _Connections

    class FakeWorker:
        def __init__(self):
            self.log = []

        def connect_remote(self, inst, md):
            self.log.append(("connect", inst, md))

        def disconnect_remote(self, inst):
            self.log.append(("disconnect", inst))

    w = FakeWorker()
    conns = _Connections(w)
    stop = threading.Event()
    genuine = conns.acquire(7, b"genuine", time.monotonic() + 5, stop)
    got = {}

    def forged():
        got["c"] = conns.acquire(7, b"forged", time.monotonic() + 5, stop)
    t = threading.Thread(target=forged)
    t.start()
    time.sleep(0.3)
    assert "c" not in got, "forged metadata re-pointed a worker id in use"
    assert [e[0] for e in w.log] == ["connect"]
    conns.release(genuine, False)
    t.join(5)
    assert got["c"].inst != genuine.inst
    assert [e[0] for e in w.log] == ["connect", "disconnect", "connect"]
    # and it gives up at its deadline when the genuine one stays in use
    conns.release(got["c"], False)
    g2 = conns.acquire(7, b"genuine", time.monotonic() + 5, stop)
    from kvbmgo.vllm.pd_wire import Unanswered as _Unanswered
    with pytest.raises(_Unanswered):
        conns.acquire(7, b"forged", time.monotonic() + 0.2, stop)
    conns.release(g2, False)


def test_a_decode_holding_one_requests_metadata_reads_that_requests_blocks_only(zctx):
    """The prefill (its own process: the scope is the server's to enforce)
    answers a pull with metadata of that request's G1 blocks only: a decode
    holding R0's reads R0's blocks byte for byte, and cannot read R1's
    blocks (refused by the prefill's server) nor its G2 (not in it)."""
    from kvbmgo import Tier
    from kvbmgo.errors import NotFoundError, UnsupportedError
    from test_disagg import PrefillProcess, _transport
    if _transport() == "loopback":
        pytest.skip("cross-process transport not available")
    prompts = {"R0": [1] + PROMPT, "R1": [2] + PROMPT}
    port = free_port()
    d = decode_engine()
    proc = PrefillProcess(port, prompts)
    try:
        first = proc.next()
        p0, p1 = first["params"]["R0"], first["params"]["R1"]
        assert set(p0["remote_block_ids"]).isdisjoint(p1["remote_block_ids"])
        frames = ask(zctx, port, {"op": "pull", "req": p0["remote_request_id"],
                                  "engine": p0["remote_engine_id"], "token": p0["kvbm_token"],
                                  "lease_s": 30}, timeout_ms=10000,
                     engine=p0["remote_engine_id"])
        head = json.loads(frames[0])
        assert head["ok"] and head["scoped"] is True, head
        w = d.worker._worker.worker
        inst = 0xA0
        w.connect_remote(inst, frames[1])
        n = len(p0["remote_block_ids"])
        local = list(range(1, 1 + n))
        n0 = w.transfer_from_instance(inst, Tier.G1, p0["remote_block_ids"], Tier.G1, local)
        n0.wait(10)
        n0.close()
        shape = d.read(0, 0).shape
        for i, b in enumerate(local):
            for layer in range(len(LAYERS)):
                want = torch.frombuffer(bytearray.fromhex(first["blocks"]["R0"][i][layer]),
                                        dtype=torch.int16).view(shape)
                assert torch.equal(d.read(b, layer), want), f"R0 block {i} layer {layer}"
        n1 = w.transfer_from_instance(inst, Tier.G1, p1["remote_block_ids"], Tier.G1, local)
        with pytest.raises(UnsupportedError, match="request-scoped capability"):
            n1.wait(10)
        n1.close()
        with pytest.raises(NotFoundError):
            w.transfer_from_instance(inst, Tier.G2, [0], Tier.G1, [1])
        w.disconnect_remote(inst)
    finally:
        proc.kill()
        d.close()


def test_a_requests_metadata_dies_with_the_request(zctx):
    """Attack 1 of the second trust round: whoever holds R0's metadata (its
    decode, or anyone it reached) pulls R0 and says done; the prefill lets
    R0 go and its blocks may go to another request, so the old metadata no
    longer reads them (revoked by the prefill before vLLM got them back),
    while R1's, made for other blocks, reads on."""
    from kvbmgo import Tier
    from kvbmgo.errors import UnsupportedError
    from test_disagg import PrefillProcess, _transport
    if _transport() == "loopback":
        pytest.skip("cross-process transport not available")
    prompts = {"R0": [1] + PROMPT, "R1": [2] + PROMPT}
    port = free_port()
    d = decode_engine()
    proc = PrefillProcess(port, prompts)
    try:
        first = proc.next()
        p0 = first["params"]["R0"]

        def pull_md(params):
            frames = ask(zctx, port, {"op": "pull", "req": params["remote_request_id"],
                                      "engine": params["remote_engine_id"],
                                      "token": params["kvbm_token"], "lease_s": 30},
                         timeout_ms=10000, engine=params["remote_engine_id"])
            head = json.loads(frames[0])
            assert head["ok"] and head["scoped"] is True, head
            return head, frames[1]

        head, md = pull_md(p0)
        w = d.worker._worker.worker
        w.connect_remote(0xA0, md)
        n = len(p0["remote_block_ids"])
        local = list(range(1, 1 + n))
        pull = w.transfer_from_instance(0xA0, Tier.G1, p0["remote_block_ids"], Tier.G1, local)
        pull.wait(10)
        pull.close()
        done = ask(zctx, port, {"op": "done", "req": p0["remote_request_id"],
                                "engine": p0["remote_engine_id"], "token": p0["kvbm_token"],
                                "lease": head["lease"]}, timeout_ms=10000,
                   engine=p0["remote_engine_id"])
        assert json.loads(done[0])["ok"], done
        while "R0" not in proc.next(timeout=60).get("finished_sending", []):
            pass
        d.raw.zero_()
        again = w.transfer_from_instance(0xA0, Tier.G1, p0["remote_block_ids"], Tier.G1, local)
        with pytest.raises(UnsupportedError, match="revoked"):
            again.wait(10)
        again.close()
        for b in local:  # no byte of the blocks' next owner arrived
            for layer in range(len(LAYERS)):
                assert not d.read(b, layer).any(), f"block {b} layer {layer}"
        w.disconnect_remote(0xA0)
    finally:
        proc.kill()
        d.close()


def test_a_prefix_two_held_requests_share_is_revoked_when_the_last_is_let_go(pd, zctx):
    """vLLM's prefix cache gives X and Y the same first blocks. X is let go:
    only its own blocks are revoked (Y's decode still reads the shared
    ones, whose bytes stay while Y is held); Y is let go: the rest."""
    p, _ = pd
    _, x, _ = prefill(p, "X", PROMPT + [7] * 20)
    _, y, _ = prefill(p, "Y", PROMPT + [9] * 20)
    p.step()
    assert server(p).held() == {"X", "Y"}
    xb, yb = set(x["remote_block_ids"]), set(y["remote_block_ids"])
    shared = xb & yb
    assert shared and xb - yb, (xb, yb)  # the test means something only with both
    srv = server(p)
    revoked = []
    real = srv._revoke
    srv._revoke = lambda ids: (revoked.append(list(ids)), real(ids))

    def done(params):
        frames = ask(zctx, port_of(p), {"op": "done", "req": params["remote_request_id"],
                                        "engine": params["remote_engine_id"],
                                        "token": params["kvbm_token"]})
        assert json.loads(frames[0])["ok"], frames

    done(x)
    while "X" in server(p).held():
        p.step()
    p.step()
    assert revoked and set(revoked[-1]) == xb - yb, (revoked, xb, yb)
    done(y)
    while "Y" in server(p).held():
        p.step()
    p.step()
    assert set(revoked[-1]) == yb, (revoked, yb)
