"""What the P/D side channels of both engines share: the vLLM connector's
(``vllm/pd_wire.py``, ``pd_prefill.py``, ``pd_decode.py``) and SGLang's PD
backend's (``sglang/pd*.py``). Their messages differ; how they guard them
is one thing, here:

- frame caps: the largest frame a socket reads (``cap_frames``);
- tokens: drawn (``new_token``) and compared in constant time (``same_token``);
- the host allow-list a decode dials through (``AllowList``);
- which key a side channel signs and checks its messages with
  (``choose_key``), and the MAC it puts on them (``Auth``).

The key (``choose_key``, once per side channel as it starts): the
deployment key when one is set (``KVBM_AUTH_KEY``, or ``KVBM_AUTH_KEY_FILE``
naming a file that holds it), the same on every prefill and decode;
without one, a key kvbm makes for this user on this host
(``same_host_key``: a file only this uid can read), which reaches peers on
this host only, so a side channel that listens on or dials a non-loopback
address refuses to start, naming the variables; unless the operator opted
out (``KVBM_PD_ALLOW_UNAUTHENTICATED=1``): then no key at all, and a
warning at every start. Nothing is ever unauthenticated by default: the
key is what keeps a peer with network reach (or another user of the host)
from registering, reading metadata and room data, and forging hand-overs.

With a key, every control message a side sends carries three more frames::

    KVBM_AUTH2, stamp = b"<sender>\\n<receiver>\\n<time ns>\\n<nonce>", mac

where mac = HMAC-SHA256(key, domain + every frame and the stamp, each
preceded by its length as 8 bytes big-endian); the domain names the
channel (a message signed for one never verifies on another), the
receiver the side it is for (its endpoint, or the request it answers: a
message signed for one instance never verifies at another). The receiver
checks the MAC (constant-time), that the stamp names it, is at most
WINDOW_S seconds from its own clock, and that it has not seen the MAC
within that window (a replay), then strips the three frames and hands the
message on with the sender from the stamp (the channel checks it against
the sender the message names: ``Auth.from_sender``).

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
from typing import (Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Set,
                    Tuple)

__all__ = ["cap_frames", "new_token", "same_token", "allow_entry", "AllowList", "ENV_KEY",
           "ENV_KEY_FILE", "ENV_UNAUTHENTICATED", "MIN_KEY_BYTES", "EXPLICIT", "SAME_HOST",
           "UNAUTHENTICATED", "load_key", "opted_out", "is_loopback", "KeyChoice",
           "refuse_unkeyed", "choose_key", "key_dir", "same_host_key", "AUTH_TAG", "WINDOW_S",
           "endpoint", "mac", "Opened", "Auth"]

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


def addresses(host: str, port: Optional[int] = None) -> List[Any]:
    """host's addresses: itself when it is one, else what it resolves to
    (none when it does not)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        try:
            return [ipaddress.ip_address(ai[4][0].split("%")[0]) for ai in
                    socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
        except (OSError, ValueError, UnicodeError):
            return []


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
        addrs = addresses(host, port)
        ok = [a for a in addrs if any(a in n for n in self.nets if a.version == n.version)]
        return str(ok[0]) if ok else None


# ---- the key: which one a side channel uses

ENV_KEY = "KVBM_AUTH_KEY"
ENV_KEY_FILE = "KVBM_AUTH_KEY_FILE"
#: The operator's explicit opt-out of authentication (every prefill and decode).
ENV_UNAUTHENTICATED = "KVBM_PD_ALLOW_UNAUTHENTICATED"
MIN_KEY_BYTES = 16
#: The same-host key's file, in key_dir().
SAME_HOST_KEY_FILE = "pd.key"

#: How a side channel is keyed (KeyChoice.how).
EXPLICIT, SAME_HOST, UNAUTHENTICATED = "explicit", "same-host", "unauthenticated"


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


def opted_out(label: str = "kvbm") -> bool:
    """Whether KVBM_PD_ALLOW_UNAUTHENTICATED says yes (1, true, yes, on);
    raises ValueError for a value that is neither yes nor no."""
    v = os.environ.get(ENV_UNAUTHENTICATED, "").strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"{label}: {ENV_UNAUTHENTICATED}={v!r}: expected 1 or 0")


def is_loopback(host: str) -> bool:
    """Whether host (an address, a CIDR, or a name: all its addresses)
    reaches this host only. A wildcard (0.0.0.0, ::) does not: it listens
    on every interface; a name that does not resolve does not either."""
    h = host.strip().strip("[]").split("%")[0]
    if not h:
        return False
    try:
        nets = [ipaddress.ip_network(h, strict=False)]
    except ValueError:
        nets = [ipaddress.ip_network(a) for a in addresses(h)]
    return bool(nets) and all(_loopback_net(n) for n in nets)


def _loopback_net(n: Any) -> bool:
    a = n.network_address
    mapped = getattr(a, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    if mapped is not None:
        return mapped.is_loopback and n.prefixlen >= 104
    return a.is_loopback and n.broadcast_address.is_loopback


class KeyChoice(NamedTuple):
    """A side channel's key (None: unauthenticated), how it was chosen
    (EXPLICIT, SAME_HOST, UNAUTHENTICATED), and where it is from (logs)."""
    key: Optional[bytes]
    how: str
    where: str

    def may_dial(self, host: str) -> Optional[str]:
        """Why a peer at host cannot be reached under this key (None: it
        can): the same-host key reaches this host only."""
        if self.how != SAME_HOST or is_loopback(host):
            return None
        return (f"{host} is not on this host and no deployment key is set: set {ENV_KEY} "
                f"(or {ENV_KEY_FILE}) to the same secret on every prefill and decode")


def refuse_unkeyed(label: str, hosts: Iterable[str]) -> None:
    """Raises ValueError (naming the variables) when a side channel that
    listens on or dials hosts would run without a deployment key across
    hosts: a non-loopback host, no key, no opt-out. Reads no key file."""
    if os.environ.get(ENV_KEY) or os.environ.get(ENV_KEY_FILE) or opted_out(label):
        return
    far = [h for h in hosts if not is_loopback(h)]
    if far:
        raise ValueError(
            f"{label}: the P/D side channel listens on or dials {', '.join(far)} (not a "
            f"loopback address) and no deployment key is set: set {ENV_KEY} (or "
            f"{ENV_KEY_FILE}) to the same secret, at least {MIN_KEY_BYTES} bytes (e.g. "
            f"openssl rand -hex 32), on every prefill and decode; or "
            f"{ENV_UNAUTHENTICATED}=1 on every one to run it unauthenticated (anyone who "
            f"reaches it can read the KV metadata and forge hand-overs)")


def choose_key(label: str, hosts: Iterable[str]) -> KeyChoice:
    """The key of a side channel that listens on or dials hosts, as it
    starts: the deployment key when set; else, opted out, none (logged at
    every start); else refused (ValueError naming the variables) when a
    host is not loopback; else the same-host key (same_host_key)."""
    hosts = list(hosts)
    key = load_key(label)
    if key is not None:
        return KeyChoice(key, EXPLICIT, ENV_KEY_FILE if os.environ.get(ENV_KEY_FILE)
                         else ENV_KEY)
    if opted_out(label):
        logger.warning("%s: %s=1: the P/D side channel (%s) runs unauthenticated: anyone "
                       "who reaches its ports can register and read the KV metadata, claim "
                       "rooms, and forge or replay hand-overs and releases. Set %s (or %s) on "
                       "every prefill and decode instead.", label, ENV_UNAUTHENTICATED,
                       ", ".join(hosts) or "no address yet", ENV_KEY, ENV_KEY_FILE)
        return KeyChoice(None, UNAUTHENTICATED, ENV_UNAUTHENTICATED)
    refuse_unkeyed(label, hosts)
    key, path = same_host_key(label)
    logger.info("%s: no %s: the P/D side channel uses this user's same-host key %s "
                "(peers on this host only)", label, ENV_KEY, path)
    return KeyChoice(key, SAME_HOST, path)


def key_dir() -> str:
    """The same-host key's directory: $XDG_RUNTIME_DIR/kvbm when set, else
    ~/.cache/kvbm/pd-auth (a directory of its own: ~/.cache/kvbm holds the
    engine venvs, and is usually readable by all)."""
    run = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(run):
        return os.path.join(run, "kvbm")
    return os.path.join(os.path.expanduser("~"), ".cache", "kvbm", "pd-auth")


def same_host_key(label: str = "kvbm") -> Tuple[bytes, str]:
    """(this user's same-host key, its file): 32 random bytes (as hex) in
    key_dir()/pd.key, made on first use. The directory is made 0700, the
    file 0600, complete before it has its name (written under a name of its
    own, O_EXCL, then linked: of processes starting at once, the first link
    wins, all read that one). A directory or file that is not this uid's,
    or that another user can read or write, is refused (ValueError), as is
    a malformed file."""
    d = key_dir()
    path = os.path.join(d, SAME_HOST_KEY_FILE)
    try:
        os.makedirs(os.path.dirname(d), mode=0o700, exist_ok=True)
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise ValueError(f"{label}: the same-host key's directory {d}: {e} (or set "
                         f"{ENV_KEY} / {ENV_KEY_FILE})") from e
    try:
        _private(os.fstat(dfd), d, label, "700")
        key = _read_same_host_key(dfd, path, label)
        if key is None:
            tmp = f".{SAME_HOST_KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                         dir_fd=dfd)
            try:
                try:
                    os.write(fd, (secrets.token_hex(32) + "\n").encode("ascii"))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                try:
                    os.link(tmp, SAME_HOST_KEY_FILE, src_dir_fd=dfd, dst_dir_fd=dfd)
                except FileExistsError:
                    pass  # another process made it first: its key is the one
            finally:
                os.unlink(tmp, dir_fd=dfd)
            key = _read_same_host_key(dfd, path, label)
        if key is None:
            raise ValueError(f"{label}: the same-host key {path} vanished as it was made")
        return key, path
    except OSError as e:
        raise ValueError(f"{label}: the same-host key {path}: {e} (or set {ENV_KEY} / "
                         f"{ENV_KEY_FILE})") from e
    finally:
        os.close(dfd)


def _private(st: os.stat_result, path: str, label: str, mode: str) -> None:
    """Refuses (ValueError) a file or directory of another uid, or one that
    another user can read or write."""
    if st.st_uid != os.geteuid():
        raise ValueError(f"{label}: {path} belongs to uid {st.st_uid}, not {os.geteuid()}: "
                         f"remove it, or set {ENV_KEY} (or {ENV_KEY_FILE})")
    if st.st_mode & 0o077:
        raise ValueError(f"{label}: {path} can be read or written by other users (mode "
                         f"{st.st_mode & 0o777:o}): chmod {mode} it, or set {ENV_KEY}")


def _read_same_host_key(dfd: int, path: str, label: str) -> Optional[bytes]:
    try:
        fd = os.open(SAME_HOST_KEY_FILE, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{label}: {path} is not a regular file")
        _private(st, path, label, "600")
        key = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(key) != 64 or not re.fullmatch(rb"[0-9a-f]+", key):
        raise ValueError(f"{label}: {path} is not a key kvbm made: remove it (the next start "
                         f"makes a new one)")
    return key


# ---- the MAC

AUTH_TAG = b"KVBM_AUTH2"
WINDOW_S = 60.0  # the clocks of a deployment's hosts agree within this (NTP)
_MAX_LOGGED = 4096  # distinct (peer, reason) pairs logged; the rest only counted
_MAX_SEEN = 1 << 20  # MACs remembered within the window


def endpoint(host: str, port: int) -> str:
    """A side's name as a receiver: host:port, an address in its one
    written form (both sides name it alike)."""
    h = host.strip().strip("[]")
    try:
        h = ipaddress.ip_address(h.split("%")[0]).compressed
    except ValueError:
        h = h.lower()
    return f"{h}:{int(port)}"


def mac(key: bytes, domain: bytes, frames: Sequence[bytes], stamp: bytes) -> bytes:
    """The MAC of a message's frames and its stamp under key, in domain."""
    h = hmac.new(key, domain, hashlib.sha256)
    for f in list(frames) + [stamp]:
        f = bytes(f)
        h.update(struct.pack(">Q", len(f)))
        h.update(f)
    return h.digest()


class Opened(NamedTuple):
    """A message taken: its frames (no authentication frames), its sender
    and the nonce of its stamp (None without a key)."""
    frames: List[bytes]
    sender: Optional[str]
    nonce: Optional[str]


class Auth:
    """One side's signing and checking of control messages (key None:
    messages go out as they are, authenticated ones are refused). domain
    names the channel; me, the receiver a message must name (the side's
    endpoint); label starts its log lines. A channel overrides
    claimed_peer to name, in the logs, who a refused message says it is from."""

    def __init__(self, key: Optional[bytes], token: str, side: str, *, domain: bytes,
                 label: str = "kvbm", me: Optional[str] = None) -> None:
        self.key = key
        self.token = token
        self.side = side  # "prefill" or "decode", for the logs
        self.domain = domain
        self.label = label
        self.me = me
        self.refused: Dict[str, int] = {}  # reason -> count
        self._lock = threading.Lock()
        self._seen: Dict[bytes, float] = {}
        self._seen_order: deque = deque()
        self._logged: set = set()

    @property
    def enabled(self) -> bool:
        return self.key is not None

    def sign(self, frames: Sequence[bytes], to: str, nonce: Optional[str] = None
             ) -> List[bytes]:
        """frames with the authentication frames for receiver to (unchanged
        without a key); nonce: the stamp's (a fresh one by default)."""
        frames = list(frames)
        if self.key is None:
            return frames
        fields = [self.token, to, str(time.time_ns()), nonce or secrets.token_hex(8)]
        if any("\n" in f for f in fields):
            raise ValueError(f"{self.label}: a name with a line break cannot be signed")
        stamp = "\n".join(fields).encode("utf-8")
        return frames + [AUTH_TAG, stamp, mac(self.key, self.domain, frames, stamp)]

    def open(self, msg: List[bytes], me: Optional[str] = None
             ) -> Optional[Tuple[List[bytes], Optional[str]]]:
        """(the message without its authentication frames, the sender's
        token, None without a key), or None: refused (counted, logged once
        per peer and reason). me: the receiver it must name (self.me)."""
        got, _ = self.verify(msg, me)
        return None if got is None else (got.frames, got.sender)

    def verify(self, msg: List[bytes], me: Optional[str] = None
               ) -> Tuple[Optional[Opened], str]:
        """(the message opened, "") or (None, why it was refused: counted,
        logged once per peer and reason)."""
        signed = len(msg) >= 4 and msg[-3] == AUTH_TAG
        if self.key is None:
            if signed:
                return self._no(msg, "authenticated", f"it is authenticated and this side "
                                f"runs unauthenticated ({ENV_UNAUTHENTICATED}): set the same "
                                f"{ENV_KEY} on every prefill and decode")
            return Opened(list(msg), None, None), ""
        if not signed:
            return self._no(msg, "unauthenticated", f"it is not authenticated and this side "
                            f"requires a key ({ENV_KEY}, or the same-host key): the peer "
                            f"needs the same one")
        frames, stamp, got = list(msg[:-3]), bytes(msg[-2]), bytes(msg[-1])
        if not hmac.compare_digest(mac(self.key, self.domain, frames, stamp), got):
            return self._no(frames, "bad mac", f"its MAC does not match (a different "
                            f"{ENV_KEY}, or altered on the way)")
        try:
            token, receiver, ns, nonce = stamp.decode("utf-8").split("\n")
            sent = int(ns) / 1e9
        except (ValueError, UnicodeDecodeError):
            return self._no(frames, "bad stamp", "its stamp is malformed")
        want = self.me if me is None else me
        if not want or receiver != want:
            return self._no(frames, "wrong receiver", f"it was signed for {receiver[:80]!r}, "
                            f"not this side (a message to another instance, replayed)",
                            f"token {token[:8]}")
        now = time.time()
        if abs(now - sent) > WINDOW_S:
            return self._no(frames, "stale", f"it was stamped {now - sent:+.0f}s ago, outside "
                            f"{WINDOW_S:.0f}s (a replay, or the hosts' clocks differ)",
                            f"token {token[:8]}")
        with self._lock:
            while self._seen_order and (self._seen_order[0][0] < now - 2 * WINDOW_S or
                                        len(self._seen_order) > _MAX_SEEN):
                _, old = self._seen_order.popleft()
                self._seen.pop(old, None)
            replay = got in self._seen
            if not replay:
                self._seen[got] = now
                self._seen_order.append((now, got))
        if replay:
            return self._no(frames, "replay", "it was received before (a replay)",
                            f"token {token[:8]}")
        return Opened(frames, token, nonce), ""

    def _no(self, msg: Sequence[bytes], reason: str, why: str, peer: Optional[str] = None
            ) -> Tuple[None, str]:
        self.refuse(msg, reason, why, peer)
        return None, reason

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
