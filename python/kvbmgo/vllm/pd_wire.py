"""What passes on KvbmConnector's P/D side channel, between a prefill worker
(``pd_prefill.PrefillServer``) and the decode workers that pull from it
(``pd_decode.DecodePuller``): the messages, their limits, and how an
exchange fails.

The KV itself moves through the library (``Worker.transfer_from_instance``:
one-sided reads of the prefill worker's G1). What travels here is small and
over pyzmq (a vLLM dependency), one request and one reply each:

- ``pull``: a decode worker asks a prefill worker for a request's blocks:
  the one of its own tensor-parallel rank, or, between TP sizes, each rank
  tp_mapping.plan names (a head slice of each block, pulled by the library). The
  reply describes that rank's KV (``kv``) and carries the prefill worker's
  exported metadata, scoped to that request's G1 blocks (read only, expiring
  with the lease: ``pd_prefill.pd_request_metadata``; the decode side
  connects to it under its own instance, which it drops after the transfer)
  and grants a lease, named by an id: the prefill keeps the blocks while any
  lease runs (a lease outlasts the decode side's deadline), so a pull never
  reads blocks the prefill has let go of, even when two decode instances
  were sent the same request.
- ``done``: the decode worker is done with the request (pulled, failed or
  aborted), with its lease's id if it has one, which decode rank it is
  (``from``) and how many decode ranks read this prefill rank
  (``consumers``, 1 unless TP sizes differ); once they all were and no
  lease runs, the prefill reports the request in ``finished_sending`` and
  vLLM frees its blocks. A prefill that never hears it lets go after
  ``pd_hold_s`` (and after the last lease).

Both carry the request's token (``kvbm_token``, see pd_prefill.py). Messages
are a JSON header frame and, for the pull reply, the metadata bytes;
nothing is unpickled. The sockets cap a frame (REQUEST_MAX, REPLY_MAX;
``_control.cap_frames``): a larger one is refused as it arrives, never read
whole.

Every message, and every answer, carries the authentication frames of
``kvbmgo._control`` (``Auth``) under the side's key
(``_control.choose_key``: the deployment key, or the same-host one), in
this channel's domain: a request names the prefill rank it is for
(``prefill_name``: its engine id and side-channel port), an answer the
request it answers (``reply_to``: the request's nonce), so neither
verifies anywhere else. A request that does not verify is answered only
with why (``unauthenticated``), unsigned, and acted on in nothing.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from .. import _control
from .._pd import HandoffRefused
from .metadata import RemotePull

__all__ = ["REQUEST_MAX", "REPLY_MAX", "MAX_CONSUMERS", "NOTHING", "frame", "header", "pull",
           "done", "answer", "refusal", "accepted", "lease_s", "done_by", "Unanswered",
           "Refused", "AUTH_DOMAIN", "LABEL", "Auth", "prefill_name", "reply_to",
           "unauthenticated"]

#: The largest frame the prefill reads (a request is a small JSON header).
REQUEST_MAX = 64 << 10
#: The largest frame the decode reads: the pull reply's metadata (a few KiB
#: per registered layout; this leaves room for thousands).
REPLY_MAX = 16 << 20
#: The most decode ranks a done may say read one prefill rank.
MAX_CONSUMERS = 4096
#: The domain of this channel's MACs (_control.mac): a message signed for
#: another channel (SGLang's) never verifies here.
AUTH_DOMAIN = b"kvbm vllm pd v1\0"
#: What the channel's log lines and errors start with.
LABEL = "kvbm P/D side channel"


class Auth(_control.Auth):
    """A side's signing and checking of the channel's messages
    (kvbmgo._control.Auth) under this channel's domain; name: the side's
    (a prefill's engine id, a decode's "engine/rank"), me: the receiver a
    message must name (a prefill's prefill_name)."""

    def __init__(self, key: Optional[bytes], name: str, side: str,
                 me: Optional[str] = None) -> None:
        super().__init__(key, name, side, domain=AUTH_DOMAIN, label=LABEL, me=me)


def prefill_name(engine_id: str, port: int) -> str:
    """A prefill rank as the receiver of a request: its engine id and its
    side channel's port (what a decode dials: remote_port + rank)."""
    return f"prefill {engine_id} port {int(port)}"


def reply_to(nonce: str) -> str:
    """The receiver an answer names: the request (its stamp's nonce)."""
    return f"reply {nonce}"


def frame(head: Dict[str, Any]) -> bytes:
    """A message's header frame."""
    return json.dumps(head).encode()


def header(data: bytes) -> Dict[str, Any]:
    """A header frame's fields ({} for one that is not a JSON object)."""
    try:
        h = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: "[[[[..."
        return {}
    return h if isinstance(h, dict) else {}


# ---- decode -> prefill

def pull(p: RemotePull, lease_s: float) -> Dict[str, Any]:
    """A decode's ``pull`` of p's blocks: a lease of lease_s seconds."""
    return {"op": "pull", "req": p.remote_request_id, "engine": p.engine_id, "token": p.token,
            "lease_s": lease_s}


def done(p: RemotePull, lease: Any, me: str, consumers: int) -> Dict[str, Any]:
    """A decode rank's (me: "engine/rank") ``done`` with p, ending its lease
    (its id, or None); consumers: the decode ranks that read this prefill rank."""
    return {"op": "done", "req": p.remote_request_id, "engine": p.engine_id, "token": p.token,
            "lease": lease, "from": me, "consumers": consumers}


def lease_s(h: Dict[str, Any]) -> Optional[float]:
    """The lease a pull h asks for, in seconds; None for a malformed one."""
    lease = h.get("lease_s")
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 <= lease < 1e6:
        return None
    return lease


def done_by(h: Dict[str, Any]) -> Tuple[str, int]:
    """Who a done is from (a decode rank: "engine/rank"; "" for a decode
    that does not say) and how many decode ranks read the prefill rank's
    blocks (1 unless it says more: heterogeneous TP)."""
    who, n = h.get("from"), h.get("consumers")
    if not isinstance(who, str) or len(who) > 512:
        who = ""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CONSUMERS:
        n = 1
    return who, n


# ---- prefill -> decode

def answer(head: Dict[str, Any], *metadata: bytes) -> List[bytes]:
    """A reply: its header frame, and (a pull's) the metadata."""
    return [frame(head), *metadata]


def refusal(why: str) -> List[bytes]:
    """A reply that says no, and why."""
    return answer({"ok": False, "why": why})


def unauthenticated(reason: str) -> List[bytes]:
    """The answer to a request that did not verify (unsigned: it says why,
    nothing else)."""
    return refusal(f"not authenticated ({reason}): every prefill and decode needs the same "
                   f"{_control.ENV_KEY} (or {_control.ENV_KEY_FILE}), or all on one host "
                   f"as one user")


def accepted() -> List[bytes]:
    """A reply that says yes (to a done)."""
    return answer({"ok": True})


#: The answer to a request the prefill does not hold, and to every message
#: it cannot tell is the request's: without the token, or a wrong one, or
#: naming another engine. The decode asks again until its deadline.
NOTHING = answer({"ok": False, "retry": True})


# ---- how an exchange fails (the decode's hand-off fails the pull)

class Unanswered(HandoffRefused):
    """The prefill worker did not answer before the deadline."""


class Refused(HandoffRefused):
    """The prefill worker answered no."""
