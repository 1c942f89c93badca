"""Disaggregated prefill->decode for KvbmConnector: the side channel
between a prefill worker and the decode workers that pull from it.

The KV itself moves through the library (``Worker.transfer_from_instance``:
one-sided reads of the prefill worker's G1). What travels here is small and
over pyzmq (a vLLM dependency), one request and one reply each:

- ``pull``: a decode worker asks a prefill worker for a request's blocks:
  the one of its own tensor-parallel rank, or, between TP sizes, each rank
  tp_mapping.plan names (a head slice then lands through staging.py). The
  reply describes that rank's KV (``kv``) and carries the prefill worker's
  exported metadata, scoped to that request's G1 blocks (read only, expiring
  with the lease: ``pd_request_metadata``; the decode side connects to it
  under its own instance, which it drops after the transfer) and grants a
  lease, named by an id: the prefill
  keeps the blocks while any lease runs (a lease outlasts the decode side's
  deadline), so a pull never reads blocks the prefill has let go of, even
  when two decode instances were sent the same request.
- ``done``: the decode worker is done with the request (pulled, failed or
  aborted), with its lease's id if it has one, which decode rank it is
  (``from``) and how many decode ranks read this prefill rank
  (``consumers``, 1 unless TP sizes differ); once they all were and no
  lease runs, the prefill reports the request in ``finished_sending`` and
  vLLM frees its blocks. A prefill that never hears it lets go after ``pd_hold_s`` (and
  after the last lease).

Trust (docs/vllm.md, "P/D"): the prefill's scheduler draws a 128-bit random
token per request and returns it in the request's kv_transfer_params
(``kvbm_token``). Both messages carry it; one without it, with a wrong one
(compared in constant time), or naming another engine is answered exactly
as a request the prefill does not hold, so an asker without the token
learns nothing (neither the metadata, nor the engine id, nor whether the
request exists) and releases nothing, not even a request held later. The
sockets cap a frame (``zmq.MAXMSGSIZE``): a larger one is refused as it
arrives, never read whole. The decode dials only the hosts
``pd_allow_hosts`` allows (any by default), checks that the metadata it got
is of the worker of the engine id and rank it asked for, and runs each
transfer against the metadata that pull got: a forged request that makes
it connect elsewhere waits for the pulls in flight, never re-points them.

The decode side drives each pull with kvbmgo's P/D driver
(``kvbmgo._pd.Handoff``, in vLLM's order: source first) and bounds it by
``pd_timeout_s``: a prefill that does not answer, or a transfer that fails
or outlasts the deadline (the library cancels it then), fails every block
of the request (reported by ``get_block_ids_with_load_errors``). A transfer
is waited for until it ended before the request is reported, so that vLLM
never reuses blocks the library may still write; the bytes of one that
outlasted the deadline are never trusted.

Messages are a JSON header frame and, for the pull reply, the metadata
bytes; nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Set, Tuple

from .._handoff import Completion, FactKind, HandoffOrder, OutcomeKind
from .._layout import Tier
from .._pd import _GRACE_S, Handoff, HandoffRefused, HandoffSide
from .._worker import _exporter_id
from ..errors import AlreadyExistsError, CanceledError, FailedPreconditionError, KvbmError
from .metadata import RemotePull
from .tp_mapping import Plan, Read, owned, plan, refusal

__all__ = ["PrefillServer", "DecodePuller", "instance_id", "pd_metadata", "pd_request_metadata"]

log = logging.getLogger(__name__)

#: How long the prefill's lease outlasts the decode side's deadline.
_LEASE_MARGIN_S = 5.0
#: Requests the prefill remembers as let go (to answer a late pull "released").
_GONE_KEPT = 4096
#: A release after a successful pull gets at least this long for its answer.
_RELEASE_MIN_S = 1.0
#: The largest frame the prefill reads (a request is a small JSON header).
REQUEST_MAX = 64 << 10
#: The largest frame the decode reads: the pull reply's metadata (a few KiB
#: per registered layout; this leaves room for thousands).
REPLY_MAX = 16 << 20
#: Connected prefill workers a decode keeps while no pull uses them.
_IDLE_KEPT = 64
#: The answer to a request the prefill does not hold, and to every message
#: it cannot tell is the request's: without the token, or a wrong one, or
#: naming another engine. The decode asks again until its deadline.
_NOTHING = [json.dumps({"ok": False, "retry": True}).encode()]
#: Seconds between two warnings about refused messages.
_REFUSED_LOG_S = 10.0
#: The side channel's thread not run for this long past its poll's timeout
#: is logged (the process starved of CPU, or another thread held the GIL).
_STALL_S = 1.0


def instance_id(wid: int, metadata: bytes) -> int:
    """The kvbm instance id a decode worker files a prefill worker's
    metadata under: its identity (worker id and bytes), so that other
    metadata never re-points it."""
    d = hashlib.blake2b(wid.to_bytes(8, "little") + metadata, digest_size=8).digest()
    return int.from_bytes(d, "little") | 1  # never 0


def pd_metadata(worker: Any) -> bytes:
    """A prefill worker's read-only metadata (every layout): what the side
    channel hands for a request when it cannot scope it (a server made
    without pd_request_metadata)."""
    return worker.export_metadata(read_only=True)


def pd_request_metadata(worker: Any, block_ids: List[int], expires_s: float) -> bytes:
    """The metadata a prefill worker hands to the decode worker that proves
    a request's token: a capability that reads that request's G1 blocks and
    nothing else (not G2, not another request's KV), for expires_s seconds."""
    return worker.export_metadata(blocks={Tier.G1: list(block_ids)}, expires=expires_s)


def _same(given: Any, want: str) -> bool:
    """given is the token want (constant time; never raises)."""
    if not isinstance(given, str) or not want:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), want.encode())


def _expected_worker(p: RemotePull, rank: int, wid: Optional[int]) -> bool:
    """wid is a kvbm worker id rank of p's prefill engine may have: rank 0's
    (the config's worker_id, else derived from the engine id) + rank, plus
    one of the offsets KvbmWorker tries when an id is taken."""
    if wid is None:
        return False
    base = p.worker_id
    if isinstance(base, bool) or not isinstance(base, int):
        from .config import engine_worker_id
        base = engine_worker_id(p.engine_id)
    d = wid - base - rank
    return d >= 0 and d % 0x10000 == 0 and d // 0x10000 < 64


class _Hold:
    """A request held for decode instances."""
    __slots__ = ("token", "until", "leases", "done_by", "consumers", "blocks")

    def __init__(self, token: str, until: float, blocks: Optional[List[int]] = None) -> None:
        self.token = token                 # the request's (kv_transfer_params kvbm_token)
        self.blocks = blocks               # its G1 blocks: what its pull's metadata covers
        self.until = until                 # let go then if unclaimed
        self.leases: Dict[str, float] = {}  # lease id -> end of that pull's lease
        # The decode ranks done with it, and how many read it (heterogeneous
        # TP: several decode ranks read one prefill rank's blocks).
        self.done_by: Set[str] = set()
        self.consumers = 1

    @property
    def done(self) -> bool:
        """Every decode rank that reads it was done with it."""
        return len(self.done_by) >= self.consumers

    def leased(self, now: float) -> bool:
        for token, end in list(self.leases.items()):
            if end <= now:
                del self.leases[token]
        return bool(self.leases)


#: The most decode ranks a done may say read one prefill rank.
_MAX_CONSUMERS = 4096


def _done_by(h: Dict[str, Any]) -> Tuple[str, int]:
    """Who a done is from (a decode rank: "engine/rank"; "" for a decode
    that does not say) and how many decode ranks read the prefill rank's
    blocks (1 unless it says more: heterogeneous TP)."""
    who, n = h.get("from"), h.get("consumers")
    if not isinstance(who, str) or len(who) > 512:
        who = ""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= _MAX_CONSUMERS:
        n = 1
    return who, n


def _header(frame: bytes) -> Dict[str, Any]:
    try:
        h = json.loads(frame)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: "[[[[..."
        return {}
    return h if isinstance(h, dict) else {}


class PrefillServer:
    """The prefill worker's side of the channel: a zmq ROUTER bound to
    tcp://host:port, served by one daemon thread. Holds the requests whose
    blocks wait for a decode instance."""

    def __init__(self, metadata: bytes, engine_id: str, host: str, port: int,
                 hold_s: float, kv: Optional[Dict[str, Any]] = None,
                 scoped: Optional[Any] = None) -> None:
        import zmq
        self.engine_id = engine_id
        self.address = f"tcp://{host}:{port}"
        self._md = metadata
        # This rank's KV as the pull reply describes it (staging.LocalKv.describe).
        self._kv = kv
        # scoped(block_ids, expires_s) -> the metadata of a request's blocks
        # only (pd_request_metadata); None: metadata for every request.
        self._scoped = scoped
        self._hold_s = hold_s
        self._lock = threading.Lock()
        self._held: Dict[str, _Hold] = {}
        self._released: Set[str] = set()           # let go, not yet reported
        self._gone: "OrderedDict[str, str]" = OrderedDict()  # let go: req -> token
        # done before held, by (req, token): only the request's token lets go of
        # it then; the decode ranks that said so, and how many read it
        self._early: "OrderedDict[Tuple[str, str], Tuple[Set[str], int]]" = OrderedDict()
        self.refused = 0                           # messages with a wrong token
        self._refused_logged = 0.0
        self._trouble_logged = 0.0                 # the last stall or error logged
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, REQUEST_MAX)  # larger: refused, not read
        try:
            self._sock.bind(self.address)
        except zmq.ZMQError as e:
            self._sock.close()
            self._ctx.term()
            raise OSError(f"kvbm P/D side channel: cannot bind {self.address}: {e} "
                          f"(kv_connector_extra_config 'pd_host', 'pd_port')") from e
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"kvbm-pd-{port}",
                                        daemon=True)
        self._thread.start()
        log.info("kvbm: P/D side channel of engine %s at %s", engine_id, self.address)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()
        self._ctx.term()

    # ---- the worker's thread

    def hold(self, req_id: str, token: str, block_ids: Optional[List[int]] = None) -> None:
        """The request's blocks (block_ids, its G1 blocks: what its pull's
        metadata covers) wait for a decode instance that proves token (until
        pd_hold_s)."""
        with self._lock:
            h = _Hold(token, time.monotonic() + self._hold_s,
                      list(block_ids) if block_ids else None)
            early = self._early.pop((req_id, token), None) if token else None
            if early is not None:
                h.done_by, h.consumers = early
                if h.done:
                    self._let_go(req_id, token)
                    return
            self._held[req_id] = h
        log.debug("kvbm: P/D: request %s held for a decode instance", req_id)

    def held(self) -> Set[str]:
        with self._lock:
            return set(self._held)

    def take_released(self) -> Set[str]:
        """Requests let go since the last call: a decode was done with them,
        or their hold expired (logged)."""
        now = time.monotonic()
        expired = []
        with self._lock:
            for req_id, h in list(self._held.items()):
                if h.leased(now):
                    continue
                if not h.done and h.until > now:
                    continue
                if not h.done:
                    expired.append(req_id)
                del self._held[req_id]
                self._let_go(req_id, h.token)
            out, self._released = self._released, set()
        # Logged outside the lock: a slow log handler never holds up the channel.
        for req_id in expired:
            log.warning("kvbm: no decode instance was done with request %s within its hold; "
                        "its blocks are freed", req_id)
        return out

    def _let_go(self, req_id: str, token: str) -> None:
        self._released.add(req_id)
        self._gone[req_id] = token
        while len(self._gone) > _GONE_KEPT:
            self._gone.popitem(last=False)

    # ---- the channel's thread

    def _serve(self) -> None:
        """Answers each message as it comes, never waiting on the engine
        (the worker's thread only takes self._lock, briefly). Survives any
        error in a message: a dead thread would leave every pull of every
        decode unanswered."""
        import zmq
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        last = time.monotonic()
        while not self._stop.is_set():
            try:
                ready = poller.poll(50)
                now = time.monotonic()
                if now - last > 0.05 + _STALL_S:
                    self._trouble("the side channel's thread did not run for %.1f s (the "
                                  "process starved of CPU, or the GIL held elsewhere)",
                                  now - last)
                last = now
                if ready:
                    self._serve_one(zmq)
            except Exception:  # noqa: BLE001 - logged; the channel keeps answering
                if self._stop.is_set():
                    break
                self._trouble("the side channel's thread: an error, the message dropped",
                              exc_info=True)
                self._stop.wait(0.01)  # an error that repeats does not spin a core
                last = time.monotonic()

    def _serve_one(self, zmq: Any) -> None:
        try:
            frames = self._sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        # From a REQ socket: [identity, b"", header]; nothing else is answered.
        if len(frames) != 3 or frames[1]:
            return
        h = _header(frames[-1])
        reply = self._answer(h)
        try:
            self._sock.send_multipart(frames[:2] + reply, zmq.NOBLOCK)
        except zmq.ZMQError as e:  # the asker went away
            log.debug("kvbm: P/D reply not sent: %s", e)
            return
        if log.isEnabledFor(logging.DEBUG):
            req = h.get("req")
            log.debug("kvbm: P/D: %s of request %r answered %s", h.get("op"),
                      req[:64] if isinstance(req, str) else None, reply[0][:80])

    def _trouble(self, msg: str, *args: Any, exc_info: bool = False) -> None:
        """A warning about the channel's thread, at most every _REFUSED_LOG_S."""
        now = time.monotonic()
        if now - self._trouble_logged >= _REFUSED_LOG_S:
            self._trouble_logged = now
            log.warning("kvbm: P/D side channel of engine %s: " + msg, self.engine_id, *args,
                        exc_info=exc_info)

    def _answer(self, h: Dict[str, Any]) -> List[bytes]:
        op, req_id, token = h.get("op"), h.get("req"), h.get("token")
        if op not in ("pull", "done") or not isinstance(req_id, str):
            return [json.dumps({"ok": False, "why": "malformed request"}).encode()]
        if not isinstance(token, str):
            token = ""  # proves nothing: answered as for a request not held
        # Another engine's request is one this engine does not hold.
        ours = h.get("engine") == self.engine_id
        with self._lock:
            hold = self._held.get(req_id) if ours else None
            gone = self._gone.get(req_id) if ours else None
            if hold is not None and not _same(token, hold.token):
                self._refuse(req_id)
                hold = None
            if gone is not None and not _same(token, gone):
                self._refuse(req_id)
                gone = None
            known = (req_id in self._held or req_id in self._gone) if ours else False
            if op == "pull":
                lease = h.get("lease_s")
                if isinstance(lease, bool) or not isinstance(lease, (int, float)) \
                        or not 0 <= lease < 1e6:
                    return [json.dumps({"ok": False, "why": "malformed lease"}).encode()]
                if hold is not None:
                    md, scoped = self._pull_metadata(req_id, hold, lease + _LEASE_MARGIN_S)
                    if md is None:
                        return [json.dumps({"ok": False, "why": "no metadata"}).encode()]
                    lease_id = uuid.uuid4().hex
                    hold.leases[lease_id] = time.monotonic() + lease + _LEASE_MARGIN_S
                    head = self._pull_head(lease_id)
                    head["scoped"] = scoped
                    return [json.dumps(head).encode(), md]
                if gone is not None:
                    return [json.dumps({"ok": False, "why": "released"}).encode()]
                # Not held yet (vLLM answered the client before this worker's
                # next step told it; the decode side asks again), or not
                # this asker's to know.
                return _NOTHING
            # done
            if hold is not None:
                lease_id = h.get("lease")
                if isinstance(lease_id, str):
                    hold.leases.pop(lease_id, None)
                who, hold.consumers = _done_by(h)
                hold.done_by.add(who)
                if hold.done and not hold.leased(time.monotonic()):
                    del self._held[req_id]
                    self._let_go(req_id, hold.token)
                return [json.dumps({"ok": True}).encode()]
            if gone is not None:
                return [json.dumps({"ok": False, "why": "released"}).encode()]
            if ours and not known and token:
                # Before the prefill holds it: let go as it is held, if token is its.
                who, n = _done_by(h)
                seen = self._early.get((req_id, token), (set(), n))[0]
                if len(seen) < _MAX_CONSUMERS:
                    seen.add(who)
                self._early[(req_id, token)] = (seen, n)
                while len(self._early) > _GONE_KEPT:
                    self._early.popitem(last=False)
            return [json.dumps({"ok": True}).encode()]

    def _pull_head(self, lease_id: str) -> Dict[str, Any]:
        """The header of a pull's answer: the lease, and this rank's KV
        (what a decode of another TP size maps its heads with)."""
        head: Dict[str, Any] = {"ok": True, "lease": lease_id}
        if self._kv is not None:
            head["kv"] = self._kv
        return head

    def _pull_metadata(self, req_id: str, hold: _Hold, expires_s: float
                       ) -> Tuple[Optional[bytes], bool]:
        """(the metadata a pull of hold gets, whether it covers the request's
        blocks only). A request's metadata that cannot be scoped is not
        handed (logged): the decode fails its blocks, and nothing wider
        goes out."""
        if self._scoped is None or not hold.blocks:
            return self._md, False
        try:
            return self._scoped(hold.blocks, expires_s), True
        except Exception as e:  # noqa: BLE001 - a closed worker too: the channel keeps serving
            log.error("kvbm: request %s: its blocks' metadata cannot be exported (%s); "
                      "its pull is refused", req_id[:64], e)
            return None, False

    def _refuse(self, req_id: str) -> None:
        """A message named a request held (or let go) here with a wrong
        token: counted; logged at most every _REFUSED_LOG_S."""
        self.refused += 1
        now = time.monotonic()
        if now - self._refused_logged >= _REFUSED_LOG_S:
            self._refused_logged = now
            log.warning("kvbm: P/D side channel of engine %s: %d messages refused so far "
                        "(a wrong token; the last for request %r)", self.engine_id,
                        self.refused, req_id[:64])


class _Unanswered(HandoffRefused):
    """The prefill worker did not answer before the deadline."""


class _Refused(HandoffRefused):
    """The prefill worker answered no."""


class _Conn:
    """A prefill worker's metadata the decode is connected to, under its own
    instance id; users: the pulls whose transfers run against it; scoped: a
    request's metadata (its own instance, dropped after its pull)."""
    __slots__ = ("md", "inst", "users", "stale", "scoped", "wid")

    def __init__(self, md: bytes, inst: int, scoped: bool = False, wid: int = 0) -> None:
        self.md, self.inst, self.users, self.stale = md, inst, 0, False
        self.scoped, self.wid = scoped, wid


class _Connections:
    """The decode's connections, one per prefill worker id (the library
    keeps one peer per worker id): a pull uses the one its metadata names;
    other metadata for that worker id (a restarted prefill, or a forged
    reply) waits until no pull uses the current one, and then replaces it,
    so that a transfer always runs against the metadata its pull got."""

    def __init__(self, worker: Any) -> None:
        self._worker = worker
        self._cv = threading.Condition()
        self._by_wid: "OrderedDict[int, _Conn]" = OrderedDict()
        self._scoped: Dict[int, int] = {}  # worker id -> request-scoped pulls connected

    def acquire(self, wid: int, md: bytes, deadline: float, stop: threading.Event) -> _Conn:
        with self._cv:
            while True:
                c = self._by_wid.get(wid)
                if c is not None and c.md == md and not c.stale:
                    c.users += 1
                    self._by_wid.move_to_end(wid)
                    return c
                if (c is None or c.users == 0) and not self._scoped.get(wid):
                    break
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    raise _Unanswered(f"pulls in flight use other metadata of worker {wid:x} "
                                      f"until the deadline")
                self._cv.wait(min(left, 0.1))
            if c is not None:
                self._drop(wid, c)
            inst = instance_id(wid, md)
            try:
                self._worker.connect_remote(inst, md)
            except AlreadyExistsError:
                pass
            c = _Conn(md, inst)
            c.users = 1
            self._by_wid[wid] = c
            for other, oc in list(self._by_wid.items()):  # forget idle ones beyond a few
                if len(self._by_wid) <= _IDLE_KEPT:
                    break
                if oc.users == 0:
                    self._drop(other, oc)
            return c

    def acquire_scoped(self, wid: int, md: bytes, deadline: float,
                       stop: threading.Event) -> _Conn:
        """Connects a request's metadata (it covers that request's blocks
        only) under its own instance, until release: the library reaches the
        prefill worker through one peer for all of them. Waits while a pull
        uses whole-worker metadata of wid, or (the library says so:
        FailedPreconditionError) scopes of another server claiming wid, so
        that nothing in flight is re-pointed."""
        inst = instance_id(wid, md)
        with self._cv:
            while True:
                c = self._by_wid.get(wid)
                if c is None or c.users == 0:
                    break
                self._wait(wid, deadline, stop)
            if c is not None:
                self._drop(wid, c)
            self._scoped[wid] = self._scoped.get(wid, 0) + 1
        try:
            while True:
                try:
                    self._worker.connect_remote(inst, md)
                    break
                except FailedPreconditionError as e:
                    if "request-scoped" not in str(e):
                        raise
                    with self._cv:
                        self._wait(wid, deadline, stop)
        except BaseException:
            self._unscope(wid)
            raise
        c = _Conn(md, inst, scoped=True, wid=wid)
        c.users = 1
        return c

    def _wait(self, wid: int, deadline: float, stop: threading.Event) -> None:
        """Waits a little for pulls of wid to end (self._cv held); raises
        _Unanswered past the deadline."""
        left = deadline - time.monotonic()
        if left <= 0 or stop.is_set():
            raise _Unanswered(f"pulls in flight use other metadata of worker {wid:x} "
                              f"until the deadline")
        self._cv.wait(min(left, 0.1))

    def _unscope(self, wid: int) -> None:
        with self._cv:
            n = self._scoped.get(wid, 0) - 1
            if n > 0:
                self._scoped[wid] = n
            else:
                self._scoped.pop(wid, None)
            self._cv.notify_all()

    def release(self, c: _Conn, failed: bool) -> None:
        """A pull's transfer against c ended; failed: connect again next time
        (a restarted prefill). A request's metadata is dropped now."""
        if c.scoped:
            try:
                self._worker.disconnect_remote(c.inst)
            except KvbmError:
                pass
            self._unscope(c.wid)
            return
        with self._cv:
            c.users -= 1
            c.stale = c.stale or failed
            self._cv.notify_all()

    def _drop(self, wid: int, c: _Conn) -> None:
        del self._by_wid[wid]
        try:
            self._worker.disconnect_remote(c.inst)
        except KvbmError:
            pass


class _Source:
    """One prefill rank of a pull: its side channel, the lease it granted,
    and the connection (on the decode worker or a staging one) its transfer
    runs against."""
    __slots__ = ("rank", "addr", "lease", "conns", "conn")

    def __init__(self, rank: int, addr: str) -> None:
        self.rank, self.addr = rank, addr
        self.lease: Dict[str, Any] = {}
        self.conns: Optional[_Connections] = None
        self.conn: Optional[_Conn] = None

    def connect(self, wid: int, md: bytes, deadline: float, stop: threading.Event) -> _Conn:
        """Connects to the metadata its lease carried, on self.conns: a
        request's own (scoped) instance when the lease says the metadata
        covers that request's blocks only."""
        assert self.conns is not None
        if self.lease.get("scoped") is True:
            return self.conns.acquire_scoped(wid, md, deadline, stop)
        return self.conns.acquire(wid, md, deadline, stop)


class _Pull(HandoffSide):
    """One request's hand-off, on the side channel: the prefill ran before
    the decode heard of it, the pull takes a lease of every prefill rank it
    reads (one with equal TP), the release tells every rank of its plan."""

    def __init__(self, puller: "DecodePuller", p: RemotePull, plan: Plan,
                 sources: Dict[int, _Source], deadline: float) -> None:
        self.puller, self.p, self.plan, self.deadline = puller, p, plan, deadline
        self.sources = sources  # prefill rank -> _Source, every rank of plan.notify

    def submit_prefill(self, h: Handoff) -> None:
        # The prefill ran: its kv_transfer_params say it holds the KV.
        h.fact(FactKind.SOURCE_HELD)

    def start_transfer(self, h: Handoff) -> None:
        puller, p = self.puller, self.p
        staged: List[Tuple[Read, _Source, Dict[str, Any]]] = []
        for read in self.plan.reads:
            src = self.sources[read.rank]
            wid, md, kv = puller._lease(p, src, self.deadline)
            if puller._direct(p, read, kv):
                src.conns = puller._conns
                src.conn = src.connect(wid, md, self.deadline, puller._stop)
                h.pull(puller._worker, src.conn.inst, p.remote_block_ids, p.block_ids)
                continue
            assert kv is not None  # _direct is True without a description
            stage = puller._staging(kv, len(self.plan.reads))
            src.conns = stage.conns
            src.conn = src.connect(wid, md, self.deadline, puller._stop)
            staged.append((read, src, kv))
        if staged:
            self._staged(h, staged)

    def _staged(self, h: Handoff, staged: List[Tuple[Read, _Source, Dict[str, Any]]]) -> None:
        """Pulls the staged reads' whole blocks into a staging slot, a chunk
        at a time, and copies their heads into this decode's blocks: the
        chunk's pulls are waited for here, each copy runs once its bytes
        landed (see staging.py for why this route)."""
        puller, p = self.puller, self.p
        stage = puller._stagings[_stage_key(staged[0][2])]
        per = stage.slot_blocks // len(staged)
        if per < 1:
            raise _Refused(f"a staging slot of {stage.slot_blocks} blocks for {len(staged)} "
                           f"prefill ranks")
        with stage.slot() as base:
            for i in range(0, len(p.block_ids), per):
                remote, local = p.remote_block_ids[i:i + per], p.block_ids[i:i + per]
                notes = []
                for j, (_, src, _) in enumerate(staged):
                    at = list(range(base + j * per, base + j * per + len(local)))
                    notes.append((h.pull(stage.worker, src.conn.inst, remote, at), at))
                try:
                    for n, _ in notes:
                        try:
                            ok = n.wait(max(0.0, self.deadline - time.monotonic()) + _GRACE_S)
                        except KvbmError as e:
                            if not isinstance(e, CanceledError):
                                h.transfer_error = e
                            raise
                        if not ok:
                            raise _Unanswered(f"the pull did not finish within its "
                                              f"{puller.timeout_s:.1f} s deadline")
                except BaseException:
                    # The slot goes back to other pulls: nothing may write it then.
                    _end(n for n, _ in notes)
                    raise
                for (read, _, _), (_, at) in zip(staged, notes):
                    try:
                        puller._local.copy_heads(stage, at, read.src, local, read.dst)
                    except RuntimeError as e:  # torch's
                        raise _Refused(f"copying heads {read.src} of prefill rank {read.rank} "
                                       f"into heads {read.dst}: {e}") from e

    def release_source(self, h: Handoff) -> OutcomeKind:
        return self.puller._release_all(self.p, self.plan, self.sources,
                                        max(self.deadline, time.monotonic() + _RELEASE_MIN_S))

    def cancel_source(self, h: Handoff) -> OutcomeKind:
        # best effort, no wait
        self.puller._release_all(self.p, self.plan, self.sources, time.monotonic())
        return OutcomeKind.APPLIED


def _end(notes: Any) -> None:
    """Cancels pulls and waits until they ended."""
    for n in notes:
        try:
            n.cancel()
            while not n.wait(1.0):
                log.warning("kvbm: waiting for a canceled pull to end before its staging "
                            "slot is reused")
        except KvbmError:
            pass


def _stage_key(kv: Dict[str, Any]) -> Tuple[int, str]:
    """Staging areas are per shape of the prefill rank's blocks."""
    return int(kv["heads"]), str(kv["order"])


class DecodePuller:
    """The decode worker's side: runs each request's pull in a small thread
    pool, as a hand-off (kvbmgo._pd.Handoff) bounded by timeout_s.
    ``finished()`` collects the pulls that ended."""

    def __init__(self, worker: Any, rank: int, tp_size: int, timeout_s: float,
                 max_pulls: int, allow_hosts: Optional[Tuple[str, ...]] = None, *,
                 local: Any = None, engine_id: str = "") -> None:
        """local: this worker's KV (staging.LocalKv; None: pulls rank to rank
        only, as before heterogeneous TP); engine_id: this decode's (its
        done messages say which decode rank they are from)."""
        import zmq
        self._worker = worker
        self.rank, self.tp_size, self.timeout_s = rank, tp_size, timeout_s
        self._local = local
        self._me = f"{engine_id}/{rank}"
        self._max_pulls = max_pulls
        # Staging areas for pulls that take part of a prefill rank's blocks,
        # by the blocks' shape (_stage_key); made at the first such pull.
        self._stagings: Dict[Tuple[int, str], Any] = {}
        self._refused_pairs: Set[Tuple[str, int]] = set()  # (engine, tp): logged once each
        self._ctx = zmq.Context()
        self._pool = ThreadPoolExecutor(max_pulls, thread_name_prefix="kvbm-pd-pull")
        self._lock = threading.Lock()
        self._conns = _Connections(worker)
        # pd_allow_hosts: names (lower case) and networks; None: any host.
        self._allow: Optional[Tuple[Set[str], List[Any]]] = None
        if allow_hosts is not None:
            names: Set[str] = set()
            nets: List[Any] = []
            for a in allow_hosts:
                try:
                    nets.append(ipaddress.ip_network(a, strict=False))
                except ValueError:
                    names.add(a.lower())
            self._allow = (names, nets)
        self._refused_hosts: Set[Tuple[str, str]] = set()  # (host, why): logged once each
        self._pending: Dict[str, Tuple[Future, List[int]]] = {}
        self._stop = threading.Event()

    def start(self, pull: RemotePull) -> None:
        """Starts pull in the background (a release alone when it has no blocks)."""
        deadline = time.monotonic() + self.timeout_s
        fut = self._pool.submit(self._run, pull, deadline)
        if pull.block_ids:
            self._pending[pull.req_id] = (fut, list(pull.block_ids))

    def finished(self) -> Tuple[Set[str], Set[int]]:
        """(requests whose pull ended, the G1 blocks of those that failed)."""
        done: Set[str] = set()
        failed: Set[int] = set()
        for req_id, (fut, ids) in list(self._pending.items()):
            if not fut.done():
                continue
            del self._pending[req_id]
            done.add(req_id)
            try:
                failed.update(fut.result())
            except Exception:  # noqa: BLE001 - a bug in a pull: fail it closed
                log.exception("kvbm: pull of request %s", req_id)
                failed.update(ids)
        return done, failed

    def close(self) -> None:
        """Ends the handshakes still waiting, waits for the transfers in flight."""
        self._stop.set()
        self._pool.shutdown(wait=True)
        self._ctx.term()
        for stage in self._stagings.values():
            stage.close()
        self._stagings.clear()

    # ---- one pull, in a pool thread

    def _run(self, p: RemotePull, deadline: float) -> List[int]:
        """Returns the G1 blocks of p that did not load (all or none)."""
        plan, why = self._plan(p)
        sources: Dict[int, _Source] = {}
        for q in plan.notify:
            addr = self._address(p, q)
            if addr is None:
                return list(p.block_ids)
            sources[q] = _Source(q, addr)
        if not p.token:
            log.error("kvbm: request %s: its kv_transfer_params carry no kvbm_token (a prefill "
                      "that is not kvbm's, or older): nothing is pulled", p.req_id)
            return list(p.block_ids)
        if why is not None:
            # Refused: the prefill ranks this rank answers for let go now.
            self._release_all(p, plan, sources, deadline)
            return list(p.block_ids)
        if not p.block_ids:
            self._release_all(p, plan, sources, deadline)
            return []
        pull = _Pull(self, p, plan, sources, deadline)
        h = Handoff(HandoffOrder.SOURCE_FIRST, pull, deadline,
                    name=f"kvbm: pull of request {p.req_id} from engine {p.engine_id}",
                    bound=f"its {self.timeout_s:.1f} s deadline")
        try:
            h.start()
        finally:
            h.close()
            for src in sources.values():
                if src.conn is not None:  # connect again next time after a failure
                    src.conns.release(src.conn, h.transfer_error is not None)
        return [] if h.completion == Completion.SUCCESS else list(p.block_ids)

    def _plan(self, p: RemotePull) -> Tuple[Plan, Optional[str]]:
        """The reads of p (tp_mapping.plan), or, for a pair of TP sizes that
        cannot be mapped, (the prefill ranks this rank answers for, why):
        logged once per prefill engine and size, with both sizes."""
        local = self._local
        if local is None:  # rank to rank, the whole block
            if p.tp_size == self.tp_size:
                return Plan((Read(self.rank, (0, 1), (0, 1)),), (self.rank,),
                            {self.rank: 1}), None
            why = (f"the prefill has tensor-parallel size {p.tp_size}, this decode "
                   f"{self.tp_size}: this worker did not describe its KV heads")
        else:
            why = refusal(p.tp_size, self.tp_size, local.total_heads, local.mla)
            if why is None and p.tp_size != self.tp_size:
                why = local.own_mismatch()
            if why is None:
                return plan(self.rank, self.tp_size, p.tp_size, local.total_heads,
                            local.mla), None
        ranks = tuple(owned(self.rank, self.tp_size, p.tp_size)) if p.tp_size >= 1 else ()
        if (p.engine_id, p.tp_size) not in self._refused_pairs and \
                len(self._refused_pairs) < 1024:
            self._refused_pairs.add((p.engine_id, p.tp_size))
            log.error("kvbm: request %s from engine %s: %s; nothing is pulled (every such "
                      "request fails)", p.req_id, p.engine_id, why)
        return Plan((), ranks, {q: 1 for q in ranks}), why

    def _address(self, p: RemotePull, rank: int) -> Optional[str]:
        """The side channel of rank of p's prefill, when pd_allow_hosts
        allows its host; None (logged once per host) if not."""
        port = p.port + rank
        host = p.host
        why = ""
        if not 0 < port < 65536:
            why = f"port {port} is not a TCP port"
        elif self._allow is not None:
            names, nets = self._allow
            if host.lower() not in names:
                try:
                    addrs = [ipaddress.ip_address(host)]
                except ValueError:
                    try:
                        addrs = [ipaddress.ip_address(ai[4][0].split("%")[0]) for ai in
                                 socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
                    except (OSError, ValueError, UnicodeError):
                        addrs = []
                ok = [a for a in addrs if any(a in n for n in nets if a.version == n.version)]
                if ok:
                    host = str(ok[0])  # dial the address checked, not the name again
                else:
                    why = "pd_allow_hosts does not allow it"
        if why:
            if (host, why) not in self._refused_hosts and len(self._refused_hosts) < 1024:
                self._refused_hosts.add((host, why))
                log.warning("kvbm: request %s names prefill host %r: %s; nothing is pulled",
                            p.req_id, host[:255], why)
            return None
        return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"

    def _lease(self, p: RemotePull, src: _Source, deadline: float
               ) -> Tuple[int, bytes, Optional[Dict[str, Any]]]:
        """Asks prefill rank src for a lease on p's blocks (its answer goes
        into src.lease): the worker id and metadata to connect to, and its
        description of its KV (None from a prefill that gives none)."""
        addr = src.addr
        if len(p.remote_block_ids) != len(p.block_ids):
            raise _Refused(f"{len(p.remote_block_ids)} remote blocks for "
                           f"{len(p.block_ids)} local ones")
        head, md = self._ask(addr, p, {"op": "pull", "req": p.remote_request_id,
                                       "engine": p.engine_id, "token": p.token,
                                       "lease_s": max(0.0, deadline - time.monotonic())},
                             deadline, retry=True)
        if not head.get("ok") or md is None:
            raise _Refused(f"the prefill refused: {head.get('why', 'no reason')}")
        src.lease.update(head)
        wid = _exporter_id(md)
        if not _expected_worker(p, src.rank, wid):
            raise _Refused(f"{addr} answered the metadata of worker "
                           f"{'(none)' if wid is None else format(wid, 'x')}, not one of "
                           f"engine {p.engine_id!r} rank {src.rank}")
        kv = head.get("kv")
        kv = kv if isinstance(kv, dict) else None
        if kv is not None and self._local is not None:
            bad = self._local.mismatch(kv, p.tp_size, src.rank)
            if bad is not None:
                raise _Refused(f"rank {src.rank} of the prefill describes KV this decode "
                               f"cannot take: {bad}")
        elif p.tp_size != self.tp_size:
            raise _Refused(f"the prefill has tensor-parallel size {p.tp_size}, this decode "
                           f"{self.tp_size}, and its rank {src.rank} does not describe its KV "
                           f"(a kvbm older than heterogeneous TP)")
        return wid, md, kv

    def _direct(self, p: RemotePull, read: Read, kv: Optional[Dict[str, Any]]) -> bool:
        """Whether read's source blocks hold exactly this decode's blocks
        (straight into G1), or only part of them or another part (staged)."""
        local = self._local
        if kv is None or local is None:
            return True  # equal TP, from a prefill that does not describe its KV
        return (read.src == (0, kv["heads"]) and read.dst == (0, local.heads)
                and (local.heads == 1 or kv["order"] == local.order))

    def _staging(self, kv: Dict[str, Any], reads: int) -> Any:
        """The staging area for blocks shaped as kv (made at its first use)."""
        key = _stage_key(kv)
        with self._lock:
            stage = self._stagings.get(key)
            if stage is None:
                if len(self._stagings) >= 4:
                    raise _Refused(f"blocks of {len(self._stagings)} other shapes are staged "
                                   f"already (prefills of several tensor-parallel sizes)")
                from .staging import Staging
                w = self._worker
                stage = Staging((w.worker_id | 1 << 62) + 0x1000 * len(self._stagings),
                                w.device_id, self._local, kv["heads"], kv["order"],
                                self._max_pulls, reads)
                stage.conns = _Connections(stage.worker)
                self._stagings[key] = stage
                log.info("kvbm: staging for pulls of blocks of %d KV heads (%s), %d slots of %d "
                         "blocks", kv["heads"], kv["order"], self._max_pulls, stage.slot_blocks)
            return stage

    def _release_all(self, p: RemotePull, plan: Plan, sources: Dict[int, _Source],
                     deadline: float) -> OutcomeKind:
        """Tells every prefill rank of plan it may let go of p's blocks (see
        _release): FAILED if one had let go already, else NOOP if one could
        not be reached, else APPLIED."""
        outs = [self._release(p, src.addr, deadline, src.lease, plan.consumers[q])
                for q, src in sources.items()]
        for o in (OutcomeKind.FAILED, OutcomeKind.NOOP):
            if o in outs:
                return o
        return OutcomeKind.APPLIED

    def _release(self, p: RemotePull, addr: str, deadline: float, lease: Dict[str, Any],
                 consumers: int = 1) -> OutcomeKind:
        """Tells the prefill rank at addr it may let go of p's blocks once
        consumers decode ranks did: APPLIED once it says so, NOOP when it
        cannot be reached by the deadline (it lets go by itself after
        pd_hold_s), FAILED when it had let go already."""
        try:
            head, _ = self._ask(addr, p, {"op": "done", "req": p.remote_request_id,
                                          "engine": p.engine_id, "token": p.token,
                                          "lease": lease.get("lease"), "from": self._me,
                                          "consumers": consumers},
                                deadline, retry=False)
        except _Unanswered as e:
            log.info("kvbm: release of request %s: %s", p.req_id, e)
            return OutcomeKind.NOOP
        if head.get("ok"):
            return OutcomeKind.APPLIED
        log.warning("kvbm: release of request %s: the prefill says %s", p.req_id,
                    head.get("why"))
        return OutcomeKind.FAILED

    def _ask(self, addr: str, p: RemotePull, header: Dict[str, Any], deadline: float, *,
             retry: bool) -> Tuple[Dict[str, Any], Optional[bytes]]:
        """One request to p's prefill worker at addr, answered by the
        deadline (a deadline already past: sent, not waited for). retry: ask
        again while the prefill answers {"retry": true}."""
        import zmq
        delay = 0.005
        not_held = 0  # answers "not held yet" before this ask
        while True:
            s = self._ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0 if deadline > time.monotonic() else 200)
            s.setsockopt(zmq.MAXMSGSIZE, REPLY_MAX)  # a larger reply: never read
            s.setsockopt(zmq.IPV6, 1)
            try:
                s.connect(addr)
                s.send(json.dumps(header).encode())
                frames = None
                while not self._stop.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    if s.poll(min(left, 0.1) * 1000, zmq.POLLIN):
                        frames = s.recv_multipart()
                        break
            finally:
                s.close()
            if frames is None:
                # Which it was tells a silent channel from a request the
                # prefill's worker had not been told it holds.
                raise _Unanswered(f"{addr} did not answer within the deadline" + (
                    f" (it had answered {not_held} asks that it did not hold request "
                    f"{p.remote_request_id} yet)" if not_held else " (no answer at all)"))
            head = _header(frames[0])
            if retry and head.get("retry"):
                not_held += 1
                if time.monotonic() + delay >= deadline or self._stop.is_set():
                    raise _Unanswered(f"{addr} did not hold request {p.remote_request_id} "
                                      f"by the deadline ({not_held} asks answered so)")
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
                continue
            return head, (frames[1] if len(frames) > 1 else None)
