"""The vLLM P/D side channel's thread (pd_prefill.PrefillServer): it answers
whatever a message does to it, says when it was kept from running, and a
decode's failed ask says whether the channel was silent or had answered
"not held yet"."""
import logging
import threading
import time

from harness import require_vllm

require_vllm()

import pytest  # noqa: E402
import zmq  # noqa: E402

from test_disagg import PROMPT, decode_engine, prefill, prefill_engine  # noqa: E402
from test_disagg_trust import ask, held_R, port_of, pulls_byte_for_byte, server  # noqa: E402


@pytest.fixture
def pd():
    p, d = prefill_engine(), decode_engine(timeout_s=2.0)
    yield p, d
    d.close()
    p.close()


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def test_a_frame_too_deep_for_the_json_parser_is_answered_and_the_channel_lives_on(pd, zctx):
    """"[" * 60000 (under the frame cap) makes json.loads raise
    RecursionError; it is a malformed request, and the channel still serves
    the genuine decode."""
    p, d = pd
    params, want = held_R(p)
    frames = ask(zctx, port_of(p), b"[" * 60000)
    assert frames is not None and b"malformed" in frames[0]
    assert server(p)._thread.is_alive()
    pulls_byte_for_byte(p, d, params, want)


def test_an_error_in_the_channel_thread_drops_the_message_not_the_channel(pd, zctx, caplog,
                                                                          monkeypatch):
    p, d = pd
    params, want = held_R(p)
    srv = server(p)
    answer = srv._answer
    calls = []

    def broken(h):
        calls.append(h)
        if len(calls) == 1:
            raise RuntimeError("a bug in the answer")
        return answer(h)
    monkeypatch.setattr(srv, "_answer", broken)
    with caplog.at_level(logging.WARNING, logger="kvbmgo.vllm.pd_prefill"):
        assert ask(zctx, port_of(p), {"op": "pull", "req": "R"}, timeout_ms=500) is None
        assert srv._thread.is_alive()
        pulls_byte_for_byte(p, d, params, want)
    assert any("an error, the message dropped" in r.getMessage() for r in caplog.records)


def test_a_channel_kept_from_running_says_so(pd, zctx, caplog):
    """The thread blocked (here on the server's lock, as by a starved CPU
    or a held GIL) for over a second: a warning names how long; the message
    waiting meanwhile is answered after."""
    p, _ = pd
    held_R(p)
    srv = server(p)
    got = []
    with caplog.at_level(logging.WARNING, logger="kvbmgo.vllm.pd_prefill"):
        with srv._lock:
            t = threading.Thread(target=lambda: got.append(
                ask(zctx, port_of(p), {"op": "pull", "req": "R"}, timeout_ms=5000)))
            t.start()
            time.sleep(1.5)
        t.join()
        deadline = time.monotonic() + 2
        while not any("did not run for" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            time.sleep(0.05)
    assert got and got[0] is not None  # answered (not held for a tokenless ask)


def _fail_reason(d, req, caplog):
    """Runs d until req ended; the pull's failure as the P/D driver logged it."""
    with caplog.at_level(logging.INFO, logger="kvbmgo"):
        t0 = time.monotonic()
        d.run(timeout=10)
        took = time.monotonic() - t0
    assert d.finished[req].finish_reason.name == "ERROR"
    msgs = [r.getMessage() for r in caplog.records if req in r.getMessage()
            or "did not" in r.getMessage()]
    return took, msgs


def test_a_silent_channel_and_a_request_never_held_fail_differently(caplog):
    """Within the deadline either way; the decode's log tells which. The
    slack past the deadline is wide (a loaded 2-core machine took 3.2 s of
    a 1.5 s deadline): without the deadline the run goes on to its own
    10 s."""
    timeout = 1.5
    slack = 4.0
    p, d = prefill_engine(), decode_engine(timeout_s=timeout)
    silent = zmq.Context()
    try:
        _, params, _ = prefill(p, "R")
        # Never held: the prefill's worker is not stepped after the prefill
        # ended, so it never learns it holds R (and answers "not held yet").
        d.add("D-not-held", PROMPT, kv_transfer_params=params)
        took, msgs = _fail_reason(d, "D-not-held", caplog)
        assert took < timeout + slack
        assert any("did not hold request R by the deadline" in m and "asks answered so" in m
                   for m in msgs) or any("asks that it did not hold" in m for m in msgs), msgs
        caplog.clear()
        # Silent: a ROUTER that reads and never answers, on another port.
        sock = silent.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        d.add("D-silent", [7] + PROMPT, kv_transfer_params=dict(params, remote_port=port))
        took, msgs = _fail_reason(d, "D-silent", caplog)
        assert took < timeout + slack
        assert any("did not answer within the deadline (no answer at all)" in m
                   for m in msgs), msgs
    finally:
        silent.destroy(linger=0)
        d.close()
        p.close()

