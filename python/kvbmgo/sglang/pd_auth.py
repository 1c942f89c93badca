"""Authentication of the control messages of kvbm's SGLang PD backend.

With a deployment key (``KVBM_AUTH_KEY``, or ``KVBM_AUTH_KEY_FILE`` naming a
file that holds it), every control message a manager sends carries three
more frames::

    KVBM_AUTH1, stamp = b"<sender token>:<time ns>:<16 hex random>", mac

where mac = HMAC-SHA256(key, "kvbm sglang pd v1\\0" + every frame and the
stamp, each preceded by its length as 8 bytes big-endian). The receiver
checks the MAC (constant-time), that the stamp is at most WINDOW_S seconds
from its own clock, and that it has not seen the MAC within that window
(a replay), then strips the three frames and hands the message on with the
sender token from the stamp (the sides check it against the token the
message names).

Both sides must agree: a side with a key refuses a message without one, a
side without a key refuses an authenticated message (it cannot check it);
each refusal is counted and logged once per peer and reason. Nothing here
unpickles or evaluates what arrives.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import stat
import struct
import threading
import time
from collections import deque
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["ENV_KEY", "ENV_KEY_FILE", "AUTH_TAG", "WINDOW_S", "load_key", "Auth",
           "warn_if_exposed"]

logger = logging.getLogger(__name__)

ENV_KEY = "KVBM_AUTH_KEY"
ENV_KEY_FILE = "KVBM_AUTH_KEY_FILE"
AUTH_TAG = b"KVBM_AUTH1"
WINDOW_S = 60.0  # the clocks of a deployment's hosts agree within this (NTP)
MIN_KEY_BYTES = 16
_DOMAIN = b"kvbm sglang pd v1\0"
_MAX_LOGGED = 4096  # distinct (peer, reason) pairs logged; the rest only counted
_MAX_SEEN = 1 << 20  # MACs remembered within the window


def load_key() -> Optional[bytes]:
    """The deployment key from the environment, or None. Raises ValueError
    for both variables set, an empty or short key, or an unreadable file."""
    value, path = os.environ.get(ENV_KEY), os.environ.get(ENV_KEY_FILE)
    if value and path:
        raise ValueError(f"kvbm transfer backend: set {ENV_KEY} or {ENV_KEY_FILE}, not both")
    if path:
        try:
            with open(path, "rb") as f:
                key = f.read().strip()
            mode = os.stat(path).st_mode
        except OSError as e:
            raise ValueError(f"kvbm transfer backend: {ENV_KEY_FILE}={path}: {e}") from e
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            logger.warning("kvbm transfer backend: %s=%s can be read by other users "
                           "(mode %o); chmod 600 it", ENV_KEY_FILE, path, mode & 0o777)
        where = f"{ENV_KEY_FILE}={path}"
    elif value:
        key, where = value.encode("utf-8"), ENV_KEY
    else:
        return None
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"kvbm transfer backend: the key in {where} has {len(key)} bytes, "
                         f"at least {MIN_KEY_BYTES} are needed (e.g. openssl rand -hex 32)")
    return key


_warned_exposed = False


def warn_if_exposed(ip: str, key: Optional[bytes]) -> bool:
    """Logs, once per process, that a side without a key listens on a
    non-loopback address. True when it logged now."""
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
    logger.warning("kvbm transfer backend: the PD control socket listens on %s without "
                   "authentication: anyone who reaches it can forge control messages "
                   "(redirect the KV metadata, fail or hijack requests). Set %s (or %s) "
                   "to the same secret on every prefill and decode of the deployment.",
                   ip, ENV_KEY, ENV_KEY_FILE)
    return True


def _mac(key: bytes, frames: Sequence[bytes], stamp: bytes) -> bytes:
    h = hmac.new(key, _DOMAIN, hashlib.sha256)
    for f in list(frames) + [stamp]:
        f = bytes(f)
        h.update(struct.pack(">Q", len(f)))
        h.update(f)
    return h.digest()


class Auth:
    """One manager's signing and checking of control messages (key None:
    messages go out as they are, authenticated ones are refused)."""

    def __init__(self, key: Optional[bytes], token: str, side: str) -> None:
        self.key = key
        self.token = token
        self.side = side  # "prefill" or "decode", for the logs
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
        return frames + [AUTH_TAG, stamp, _mac(self.key, frames, stamp)]

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
        frames, stamp, mac = msg[:-3], bytes(msg[-2]), bytes(msg[-1])
        if not hmac.compare_digest(_mac(self.key, frames, stamp), mac):
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
            if mac in self._seen:
                replay = True
            else:
                replay = False
                self._seen[mac] = now
                self._seen_order.append((now, mac))
        if replay:
            self.refuse(frames, "replay", "it was received before (a replay)", token)
            return None
        return frames, token

    def refuse(self, msg: Sequence[bytes], reason: str, why: str,
               peer: Optional[str] = None) -> None:
        """Counts a refused message and logs it once per (peer, reason)."""
        tag = bytes(msg[0][:20]) if msg else b"?"
        peer = peer or _claimed_peer(msg)
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1
            key = (peer, reason)
            if key in self._logged or len(self._logged) >= _MAX_LOGGED:
                return
            self._logged.add(key)
        logger.warning("kvbm transfer backend (%s): refused a %s message from %s: %s "
                       "(logged once per peer)", self.side, tag.decode("ascii", "replace"),
                       peer, why)


def _claimed_peer(msg: Sequence[bytes]) -> str:
    """Who a message says it is from (unchecked), for the logs."""
    try:
        tag = bytes(msg[0])
        if tag == b"KVBM_REG":
            return f"{bytes(msg[1]).decode('ascii')}:{int(msg[2])} (claimed)"
        if tag == b"KVBM_ROOM":
            return f"{bytes(msg[2]).decode('ascii')}:{int(msg[3])} (claimed)"
        if tag in (b"KVBM_DONE", b"KVBM_PULL", b"KVBM_META"):
            name = bytes(msg[1] if tag == b"KVBM_META" else msg[2]).decode("ascii")
            return f"token {name[:8]} (claimed)"
    except (IndexError, ValueError, UnicodeDecodeError):
        pass
    return "an unknown peer"
