"""Speaking to a vLLM P/D side channel as a peer does, for the tests: one
REQ/REP exchange, signed (pd_wire.Auth) under a key for the prefill rank it
is sent to, its answer opened as the decode opens it. The key is, by
default, the one the test engines use (the same-host key: with no
KVBM_AUTH_KEY, a member of the deployment); None sends the message
unsigned (an attacker with network reach only)."""
import json

import zmq

from kvbmgo import _control
from kvbmgo.vllm import pd_wire as wire

#: The engines' key (the same-host key of the suite's XDG_RUNTIME_DIR).
MEMBER = "member"


def signed(header, port, *, engine="prefill-engine", key=MEMBER):
    """(header's frames signed for engine's rank at port, the nonce its answer names)."""
    if key == MEMBER:
        key = _control.same_host_key()[0]
    data = header if isinstance(header, bytes) else json.dumps(header).encode()
    nonce = _control.new_token()
    auth = wire.Auth(key, "tester/0", "decode")
    return auth.sign([data], wire.prefill_name(engine, port), nonce), nonce


def exchange(ctx, port, frames, timeout_ms=3000, host="127.0.0.1"):
    """Sends frames as they are; the answer's frames (None: no answer)."""
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://{host}:{port}")
    s.send_multipart(frames)
    got = s.recv_multipart() if s.poll(timeout_ms) else None
    s.close()
    return got


def ask(ctx, port, header, timeout_ms=3000, *, engine="prefill-engine", key=MEMBER):
    """One exchange: the answer's frames, opened when it is signed for this
    ask (as they are when it is not: an unsigned refusal), None for no answer."""
    frames, nonce = signed(header, port, engine=engine, key=key)
    got = exchange(ctx, port, frames, timeout_ms)
    if got is None or key is None:
        return got
    if key == MEMBER:
        key = _control.same_host_key()[0]
    opened = wire.Auth(key, "tester/0", "decode").open(got, me=wire.reply_to(nonce))
    return got if opened is None else opened[0]
