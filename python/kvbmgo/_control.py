"""What the P/D side channels of both engines share: the vLLM connector's
(``vllm/pd_wire.py``, ``pd_prefill.py``, ``pd_decode.py``) and SGLang's PD
backend's (``sglang/pd*.py``). Their messages differ; how they guard them
is one thing, here:

- frame caps: the largest frame a socket reads (``cap_frames``);
- tokens: drawn (``new_token``) and compared in constant time (``same_token``);
- the host allow-list a decode dials through (``AllowList``);
- the deployment key (``KVBM_AUTH_KEY``, or ``KVBM_AUTH_KEY_FILE`` naming a
  file that holds it) and the MAC it puts on control messages (``Auth``).

With a key, every control message a side sends carries three more frames::

    KVBM_AUTH1, stamp = b"<sender token>:<time ns>:<16 hex random>", mac

where mac = HMAC-SHA256(key, domain + every frame and the stamp, each
preceded by its length as 8 bytes big-endian); the domain names the
channel (a message signed for one never verifies on another). The receiver
checks the MAC (constant-time), that the stamp is at most WINDOW_S seconds
from its own clock, and that it has not seen the MAC within that window (a
replay), then strips the three frames and hands the message on with the
sender token from the stamp (the channel checks it against the sender the
message names: ``Auth.from_sender``).

Both sides must agree: a side with a key refuses a message without one, a
side without a key refuses an authenticated message (it cannot check it);
each refusal is counted and logged once per peer and reason.

Engine-neutral: no engine is imported, no socket opened, no thread started
(zmq is imported by ``cap_frames`` only, on a socket its caller made).
Nothing here unpickles or evaluates what arrives.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import socket
import stat
import struct
import threading
import time
from collections import deque
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

__all__ = ["cap_frames", "new_token", "same_token", "allow_entry", "AllowList", "ENV_KEY",
           "ENV_KEY_FILE", "AUTH_TAG", "WINDOW_S", "MIN_KEY_BYTES", "load_key",
           "warn_if_exposed", "mac", "Auth"]

logger = logging.getLogger(__name__)


# ---- frame caps

def cap_frames(zmq_obj: Any, limit: int) -> None:
    """Caps the frames zmq_obj (a socket, or a context: the default of the
    sockets made from it afterwards) reads at limit bytes
    (``zmq.MAXMSGSIZE``): libzmq refuses a larger frame from its header and
    disconnects its sender; it is never read whole."""
    import zmq
    zmq_obj.setsockopt(zmq.MAXMSGSIZE, limit)


# ---- tokens

#: A token's random bytes (128 bits).
TOKEN_BYTES = 16


def new_token() -> str:
    """A fresh random token (TOKEN_BYTES, as hex): a request's proof, or a
    nonce an answer must repeat."""
    return secrets.token_hex(TOKEN_BYTES)


def same_token(given: Any, want: str) -> bool:
    """given is the token want (constant time; never raises). An empty want
    matches nothing, a given that is not a str neither."""
    if not isinstance(given, str) or not want:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), want.encode())


# ---- the host allow-list

_HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})")


def allow_entry(entry: str) -> bool:
    """Whether entry can be on an allow-list: an address, a CIDR or a host name."""
    try:
        ipaddress.ip_network(entry, strict=False)
        return True
    except ValueError:
        return _HOST_NAME.fullmatch(entry) is not None


class AllowList:
    """The hosts a side dials: names (compared in lower case) and networks
    (an entry that parses as an address or CIDR)."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.names: Set[str] = set()
        self.nets: List[Any] = []
        for a in entries:
            try:
                self.nets.append(ipaddress.ip_network(a, strict=False))
            except ValueError:
                self.names.add(a.lower())

    def address(self, host: str, port: int) -> Optional[str]:
        """The host to dial for host:port, or None when it is not allowed:
        host itself when the list names it; else the first of its addresses
        (host's own, or what it resolves to) in one of the networks, so that
        the address checked is the one dialled, not the name again."""
        if host.lower() in self.names:
            return host
        try:
            addrs = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                addrs = [ipaddress.ip_address(ai[4][0].split("%")[0]) for ai in
                         socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
            except (OSError, ValueError, UnicodeError):
                addrs = []
        ok = [a for a in addrs if any(a in n for n in self.nets if a.version == n.version)]
        return str(ok[0]) if ok else None


# ---- the deployment key

ENV_KEY = "KVBM_AUTH_KEY"
ENV_KEY_FILE = "KVBM_AUTH_KEY_FILE"
AUTH_TAG = b"KVBM_AUTH1"
WINDOW_S = 60.0  # the clocks of a deployment's hosts agree within this (NTP)
MIN_KEY_BYTES = 16
_MAX_LOGGED = 4096  # distinct (peer, reason) pairs logged; the rest only counted
_MAX_SEEN = 1 << 20  # MACs remembered within the window


def load_key(label: str = "kvbm") -> Optional[bytes]:
    """The deployment key from the environment, or None. Raises ValueError
    (its message starting with label) for both variables set, an empty or
    short key, or an unreadable file."""
    value, path = os.environ.get(ENV_KEY), os.environ.get(ENV_KEY_FILE)
    if value and path:
        raise ValueError(f"{label}: set {ENV_KEY} or {ENV_KEY_FILE}, not both")
    if path:
        try:
            with open(path, "rb") as f:
                key = f.read().strip()
            mode = os.stat(path).st_mode
        except OSError as e:
            raise ValueError(f"{label}: {ENV_KEY_FILE}={path}: {e}") from e
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            logger.warning("%s: %s=%s can be read by other users (mode %o); chmod 600 it",
                           label, ENV_KEY_FILE, path, mode & 0o777)
        where = f"{ENV_KEY_FILE}={path}"
    elif value:
        key, where = value.encode("utf-8"), ENV_KEY
    else:
        return None
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{label}: the key in {where} has {len(key)} bytes, "
                         f"at least {MIN_KEY_BYTES} are needed (e.g. openssl rand -hex 32)")
    return key


_warned_exposed = False


def warn_if_exposed(ip: str, key: Optional[bytes], label: str = "kvbm") -> bool:
    """Logs, once per process, that a side without a key listens (its
    control socket) on a non-loopback address. True when it logged now."""
    global _warned_exposed
    if key is not None or _warned_exposed:
        return False
    try:
        loopback = ipaddress.ip_address(ip.strip("[]")).is_loopback
    except ValueError:
        loopback = ip == "localhost"
    if loopback:
        return False
    _warned_exposed = True
    logger.warning("%s: the PD control socket listens on %s without "
                   "authentication: anyone who reaches it can forge control messages "
                   "(redirect the KV metadata, fail or hijack requests). Set %s (or %s) "
                   "to the same secret on every prefill and decode of the deployment.",
                   label, ip, ENV_KEY, ENV_KEY_FILE)
    return True


def mac(key: bytes, domain: bytes, frames: Sequence[bytes], stamp: bytes) -> bytes:
    """The MAC of a message's frames and its stamp under key, in domain."""
    h = hmac.new(key, domain, hashlib.sha256)
    for f in list(frames) + [stamp]:
        f = bytes(f)
        h.update(struct.pack(">Q", len(f)))
        h.update(f)
    return h.digest()


class Auth:
    """One side's signing and checking of control messages (key None:
    messages go out as they are, authenticated ones are refused). domain
    names the channel; label starts its log lines. A channel overrides
    claimed_peer to name, in the logs, who a refused message says it is from."""

    def __init__(self, key: Optional[bytes], token: str, side: str, *, domain: bytes,
                 label: str = "kvbm") -> None:
        self.key = key
        self.token = token
        self.side = side  # "prefill" or "decode", for the logs
        self.domain = domain
        self.label = label
        self.refused: Dict[str, int] = {}  # reason -> count
        self._lock = threading.Lock()
        self._seen: Dict[bytes, float] = {}
        self._seen_order: deque = deque()
        self._logged: set = set()

    @property
    def enabled(self) -> bool:
        return self.key is not None

    def sign(self, frames: Sequence[bytes]) -> List[bytes]:
        """frames with the authentication frames (unchanged without a key)."""
        frames = list(frames)
        if self.key is None:
            return frames
        stamp = f"{self.token}:{time.time_ns()}:{secrets.token_hex(8)}".encode("ascii")
        return frames + [AUTH_TAG, stamp, mac(self.key, self.domain, frames, stamp)]

    def open(self, msg: List[bytes]) -> Optional[Tuple[List[bytes], Optional[str]]]:
        """(the message without its authentication frames, the sender's
        token, None without a key), or None: refused (counted, logged once
        per peer and reason)."""
        signed = len(msg) >= 4 and msg[-3] == AUTH_TAG
        if self.key is None:
            if signed:
                self.refuse(msg, "authenticated", f"it is authenticated and this side has no "
                            f"{ENV_KEY}: set the same key on every prefill and decode")
                return None
            return msg, None
        if not signed:
            self.refuse(msg, "unauthenticated", f"it is not authenticated and {ENV_KEY} is set "
                        f"here: set the same key on the peer")
            return None
        frames, stamp, got = msg[:-3], bytes(msg[-2]), bytes(msg[-1])
        if not hmac.compare_digest(mac(self.key, self.domain, frames, stamp), got):
            self.refuse(frames, "bad mac", f"its MAC does not match (a different {ENV_KEY}, "
                        f"or altered on the way)")
            return None
        try:
            token, ns, _ = stamp.decode("ascii").split(":")
            sent = int(ns) / 1e9
        except (ValueError, UnicodeDecodeError):
            self.refuse(frames, "bad stamp", "its stamp is malformed")
            return None
        now = time.time()
        if abs(now - sent) > WINDOW_S:
            self.refuse(frames, "stale", f"it was stamped {now - sent:+.0f}s ago, outside "
                        f"{WINDOW_S:.0f}s (a replay, or the hosts' clocks differ)", token)
            return None
        with self._lock:
            while self._seen_order and (self._seen_order[0][0] < now - 2 * WINDOW_S or
                                        len(self._seen_order) > _MAX_SEEN):
                _, old = self._seen_order.popleft()
                self._seen.pop(old, None)
            if got in self._seen:
                replay = True
            else:
                replay = False
                self._seen[got] = now
                self._seen_order.append((now, got))
        if replay:
            self.refuse(frames, "replay", "it was received before (a replay)", token)
            return None
        return frames, token

    def from_sender(self, msg: Sequence[bytes], sender: Optional[str], named: str, who: str,
                    peer: Optional[str] = None) -> bool:
        """Whether msg, which names named (a decode or prefill: who), comes
        from it: its authenticated sender (None: no key, nothing to check)
        is named. Refused ("not its sender") if not, logged as from peer
        (by default the sender's token)."""
        if sender is None or sender == named:
            return True
        self.refuse(msg, "not its sender", f"it names {who} {named[:8]}, its "
                    f"authentication {sender[:8]}", peer or f"token {sender[:8]}")
        return False

    def refuse(self, msg: Sequence[bytes], reason: str, why: str,
               peer: Optional[str] = None) -> None:
        """Counts a refused message and logs it once per (peer, reason)."""
        tag = bytes(msg[0][:20]) if msg else b"?"
        peer = peer or self.claimed_peer(msg)
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1
            key = (peer, reason)
            if key in self._logged or len(self._logged) >= _MAX_LOGGED:
                return
            self._logged.add(key)
        logger.warning("%s (%s): refused a %s message from %s: %s (logged once per peer)",
                       self.label, self.side, tag.decode("ascii", "replace"), peer, why)

    def claimed_peer(self, msg: Sequence[bytes]) -> str:
        """Who msg says it is from (unchecked), for the logs."""
        return "an unknown peer"
