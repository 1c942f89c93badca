"""Disaggregated prefill->decode for KvbmConnector: the side channel
between a prefill worker and the decode workers that pull from it.

The KV itself moves through the library (``Worker.transfer_from_instance``:
one-sided reads of the prefill worker's G1). What travels here is small and
over pyzmq (a vLLM dependency), one request and one reply each:

- ``pull``: a decode worker asks the prefill worker of the same tensor-parallel
  rank for a request's blocks. The reply carries the prefill worker's
  exported metadata, scoped to that request's G1 blocks (read only, expiring
  with the lease: ``pd_request_metadata``; the decode side connects to it
  under its own instance, which it drops after the transfer) and grants a
  lease, named by an id: the prefill
  keeps the blocks while any lease runs (a lease outlasts the decode side's
  deadline), so a pull never reads blocks the prefill has let go of, even
  when two decode instances were sent the same request.
- ``done``: the decode worker is done with the request (pulled, failed or
  aborted), with its lease's id if it has one; once no lease runs, the
  prefill reports the request in ``finished_sending`` and vLLM frees its
  blocks. A prefill that never hears it lets go after ``pd_hold_s`` (and
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
from .._pd import Handoff, HandoffRefused, HandoffSide
from .._worker import _exporter_id
from ..errors import AlreadyExistsError, FailedPreconditionError, KvbmError
from .metadata import RemotePull

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
    __slots__ = ("token", "until", "leases", "done", "blocks")

    def __init__(self, token: str, until: float, blocks: Optional[List[int]] = None) -> None:
        self.token = token                 # the request's (kv_transfer_params kvbm_token)
        self.blocks = blocks               # its G1 blocks: what its pull's metadata covers
        self.until = until                 # let go then if unclaimed
        self.leases: Dict[str, float] = {}  # lease id -> end of that pull's lease
        self.done = False                  # a decode instance was done with it

    def leased(self, now: float) -> bool:
        for token, end in list(self.leases.items()):
            if end <= now:
                del self.leases[token]
        return bool(self.leases)


def _header(frame: bytes) -> Dict[str, Any]:
    try:
        h = json.loads(frame)
    except (ValueError, UnicodeDecodeError):
        return {}
    return h if isinstance(h, dict) else {}


class PrefillServer:
    """The prefill worker's side of the channel: a zmq ROUTER bound to
    tcp://host:port, served by one daemon thread. Holds the requests whose
    blocks wait for a decode instance."""

    def __init__(self, metadata: bytes, engine_id: str, host: str, port: int,
                 hold_s: float, scoped: Optional[Any] = None) -> None:
        import zmq
        self.engine_id = engine_id
        self.address = f"tcp://{host}:{port}"
        self._md = metadata
        # scoped(block_ids, expires_s) -> the metadata of a request's blocks
        # only (pd_request_metadata); None: metadata for every request.
        self._scoped = scoped
        self._hold_s = hold_s
        self._lock = threading.Lock()
        self._held: Dict[str, _Hold] = {}
        self._released: Set[str] = set()           # let go, not yet reported
        self._gone: "OrderedDict[str, str]" = OrderedDict()  # let go: req -> token
        # done before held, by (req, token): only the request's token lets go of it then
        self._early: "OrderedDict[Tuple[str, str], None]" = OrderedDict()
        self.refused = 0                           # messages with a wrong token
        self._refused_logged = 0.0
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
            if token and self._early.pop((req_id, token), "absent") is None:
                self._let_go(req_id, token)
                return
            self._held[req_id] = _Hold(token, time.monotonic() + self._hold_s,
                                       list(block_ids) if block_ids else None)

    def held(self) -> Set[str]:
        with self._lock:
            return set(self._held)

    def take_released(self) -> Set[str]:
        """Requests let go since the last call: a decode was done with them,
        or their hold expired (logged)."""
        now = time.monotonic()
        with self._lock:
            for req_id, h in list(self._held.items()):
                if h.leased(now):
                    continue
                if not h.done and h.until > now:
                    continue
                if not h.done:
                    log.warning("kvbm: no decode instance was done with request %s within "
                                "its hold; its blocks are freed", req_id)
                del self._held[req_id]
                self._let_go(req_id, h.token)
            out, self._released = self._released, set()
            return out

    def _let_go(self, req_id: str, token: str) -> None:
        self._released.add(req_id)
        self._gone[req_id] = token
        while len(self._gone) > _GONE_KEPT:
            self._gone.popitem(last=False)

    # ---- the channel's thread

    def _serve(self) -> None:
        import zmq
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                continue
            # From a REQ socket: [identity, b"", header]; nothing else is answered.
            if len(frames) != 3 or frames[1]:
                continue
            reply = self._answer(_header(frames[-1]))
            try:
                self._sock.send_multipart(frames[:2] + reply, zmq.NOBLOCK)
            except zmq.ZMQError as e:  # the asker went away
                log.debug("kvbm: P/D reply not sent: %s", e)

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
                    return [json.dumps({"ok": True, "lease": lease_id, "scoped": scoped}).encode(), md]
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
                hold.done = True
                if not hold.leased(time.monotonic()):
                    del self._held[req_id]
                    self._let_go(req_id, hold.token)
                return [json.dumps({"ok": True}).encode()]
            if gone is not None:
                return [json.dumps({"ok": False, "why": "released"}).encode()]
            if ours and not known and token:
                # Before the prefill holds it: let go as it is held, if token is its.
                self._early[(req_id, token)] = None
                while len(self._early) > _GONE_KEPT:
                    self._early.popitem(last=False)
            return [json.dumps({"ok": True}).encode()]

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


class _Pull(HandoffSide):
    """One request's hand-off, on the side channel: the prefill ran before
    the decode heard of it, the pull takes a lease, the release ends it."""

    def __init__(self, puller: "DecodePuller", p: RemotePull, addr: str,
                 deadline: float) -> None:
        self.puller, self.p, self.addr, self.deadline = puller, p, addr, deadline
        self.lease: Dict[str, Any] = {}  # the prefill's answer to our pull (its lease id)
        self.conn: Optional[_Conn] = None  # what the transfer runs against

    def submit_prefill(self, h: Handoff) -> None:
        # The prefill ran: its kv_transfer_params say it holds the KV.
        h.fact(FactKind.SOURCE_HELD)

    def start_transfer(self, h: Handoff) -> None:
        p = self.p
        self.conn = self.puller._lease(p, self.addr, self.deadline, self.lease)
        h.pull(self.puller._worker, self.conn.inst, p.remote_block_ids, p.block_ids)

    def release_source(self, h: Handoff) -> OutcomeKind:
        return self.puller._release(self.p, self.addr, max(self.deadline, time.monotonic() +
                                                           _RELEASE_MIN_S), self.lease)

    def cancel_source(self, h: Handoff) -> OutcomeKind:
        # best effort, no wait
        self.puller._release(self.p, self.addr, time.monotonic(), self.lease)
        return OutcomeKind.APPLIED


class DecodePuller:
    """The decode worker's side: runs each request's pull in a small thread
    pool, as a hand-off (kvbmgo._pd.Handoff) bounded by timeout_s.
    ``finished()`` collects the pulls that ended."""

    def __init__(self, worker: Any, rank: int, tp_size: int, timeout_s: float,
                 max_pulls: int, allow_hosts: Optional[Tuple[str, ...]] = None) -> None:
        import zmq
        self._worker = worker
        self.rank, self.tp_size, self.timeout_s = rank, tp_size, timeout_s
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

    # ---- one pull, in a pool thread

    def _run(self, p: RemotePull, deadline: float) -> List[int]:
        """Returns the G1 blocks of p that did not load (all or none)."""
        addr = self._address(p)
        if addr is None:
            return list(p.block_ids)
        if not p.token:
            log.error("kvbm: request %s: its kv_transfer_params carry no kvbm_token (a prefill "
                      "that is not kvbm's, or older): nothing is pulled", p.req_id)
            return list(p.block_ids)
        if not p.block_ids:
            self._release(p, addr, deadline, {})
            return []
        pull = _Pull(self, p, addr, deadline)
        h = Handoff(HandoffOrder.SOURCE_FIRST, pull, deadline,
                    name=f"kvbm: pull of request {p.req_id} from engine {p.engine_id}",
                    bound=f"its {self.timeout_s:.1f} s deadline")
        try:
            h.start()
        finally:
            h.close()
            if pull.conn is not None:  # connect again next time after a failure
                self._conns.release(pull.conn, h.transfer_error is not None)
        return [] if h.completion == Completion.SUCCESS else list(p.block_ids)

    def _address(self, p: RemotePull) -> Optional[str]:
        """The side channel of p's prefill worker (this rank's), when
        pd_allow_hosts allows its host; None (logged once per host) if not."""
        port = p.port + self.rank
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

    def _lease(self, p: RemotePull, addr: str, deadline: float, lease: Dict[str, Any]
               ) -> _Conn:
        """Asks p's prefill worker for a lease on its blocks (its answer goes
        into lease) and connects to the metadata it answered: the connection
        to pull from, used until the pull ends."""
        if p.tp_size != self.tp_size:
            raise _Refused(f"the prefill has tensor-parallel size {p.tp_size}, this decode "
                           f"{self.tp_size}: kvbm pulls rank to rank")
        if len(p.remote_block_ids) != len(p.block_ids):
            raise _Refused(f"{len(p.remote_block_ids)} remote blocks for "
                           f"{len(p.block_ids)} local ones")
        head, md = self._ask(addr, p, {"op": "pull", "req": p.remote_request_id,
                                       "engine": p.engine_id, "token": p.token,
                                       "lease_s": max(0.0, deadline - time.monotonic())},
                             deadline, retry=True)
        if not head.get("ok") or md is None:
            raise _Refused(f"the prefill refused: {head.get('why', 'no reason')}")
        lease.update(head)
        wid = _exporter_id(md)
        if not _expected_worker(p, self.rank, wid):
            raise _Refused(f"{addr} answered the metadata of worker "
                           f"{'(none)' if wid is None else format(wid, 'x')}, not one of "
                           f"engine {p.engine_id!r} rank {self.rank}")
        if head.get("scoped") is True:
            return self._conns.acquire_scoped(wid, md, deadline, self._stop)
        return self._conns.acquire(wid, md, deadline, self._stop)

    def _release(self, p: RemotePull, addr: str, deadline: float, lease: Dict[str, Any]
                 ) -> OutcomeKind:
        """Tells the prefill it may let go of p's blocks: APPLIED once it
        says so, NOOP when it cannot be reached by the deadline (it lets
        go by itself after pd_hold_s), FAILED when it had let go already."""
        try:
            head, _ = self._ask(addr, p, {"op": "done", "req": p.remote_request_id,
                                          "engine": p.engine_id, "token": p.token,
                                          "lease": lease.get("lease")},
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
                raise _Unanswered(f"{addr} did not answer within the deadline")
            head = _header(frames[0])
            if retry and head.get("retry"):
                if time.monotonic() + delay >= deadline or self._stop.is_set():
                    raise _Unanswered(f"{addr} did not hold request {p.remote_request_id} "
                                      f"by the deadline")
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
                continue
            return head, (frames[1] if len(frames) > 1 else None)
