"""Disaggregated prefill->decode for KvbmConnector: the side channel
between a prefill worker and the decode workers that pull from it.

The KV itself moves through the library (``Worker.transfer_from_instance``:
one-sided reads of the prefill worker's G1). What travels here is small and
over pyzmq (a vLLM dependency), one request and one reply each:

- ``pull``: a decode worker asks the prefill worker of the same tensor-parallel
  rank for a request's blocks. The reply carries the prefill worker's
  exported metadata (the decode side connects to it, keyed by engine id and
  rank, again when it changes) and grants a lease, named by a token: the
  prefill keeps the blocks while any lease runs (a lease outlasts the
  decode side's deadline), so a pull never reads blocks the prefill has let
  go of, even when two decode instances were sent the same request.
- ``done``: the decode worker is done with the request (pulled, failed or
  aborted), with its lease's token if it has one; once no lease runs, the
  prefill reports the request in ``finished_sending`` and vLLM frees its
  blocks. A prefill that never hears it lets go after ``pd_hold_s`` (and
  after the last lease).

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
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Set, Tuple

from .._handoff import Completion, FactKind, HandoffOrder, OutcomeKind
from .._pd import Handoff, HandoffRefused, HandoffSide
from ..errors import AlreadyExistsError
from .metadata import RemotePull

__all__ = ["PrefillServer", "DecodePuller", "instance_id"]

log = logging.getLogger(__name__)

#: How long the prefill's lease outlasts the decode side's deadline.
_LEASE_MARGIN_S = 5.0
#: Requests the prefill remembers as let go (to answer a late pull "released").
_GONE_KEPT = 4096
#: A release after a successful pull gets at least this long for its answer.
_RELEASE_MIN_S = 1.0


def instance_id(engine_id: str, rank: int) -> int:
    """The kvbm instance id a decode worker files a prefill worker under."""
    d = hashlib.blake2b(f"{engine_id}/{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(d, "little") | 1  # never 0


class _Hold:
    """A request held for decode instances."""
    __slots__ = ("until", "leases", "done")

    def __init__(self, until: float) -> None:
        self.until = until                 # let go then if unclaimed
        self.leases: Dict[str, float] = {}  # token -> end of that pull's lease
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
                 hold_s: float) -> None:
        import zmq
        self.engine_id = engine_id
        self.address = f"tcp://{host}:{port}"
        self._md = metadata
        self._hold_s = hold_s
        self._lock = threading.Lock()
        self._held: Dict[str, _Hold] = {}
        self._released: Set[str] = set()           # let go, not yet reported
        self._gone: "OrderedDict[str, None]" = OrderedDict()
        self._early: "OrderedDict[str, None]" = OrderedDict()  # done before held
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
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

    def hold(self, req_id: str) -> None:
        """The request's blocks wait for a decode instance (until pd_hold_s)."""
        with self._lock:
            if self._early.pop(req_id, "absent") is None:
                self._let_go(req_id)
                return
            self._held[req_id] = _Hold(time.monotonic() + self._hold_s)

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
                self._let_go(req_id)
            out, self._released = self._released, set()
            return out

    def _let_go(self, req_id: str) -> None:
        self._released.add(req_id)
        self._gone[req_id] = None
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
            # From a REQ socket: [identity, b"", header]
            if len(frames) < 3:
                continue
            reply = self._answer(_header(frames[-1]))
            try:
                self._sock.send_multipart(frames[:2] + reply, zmq.NOBLOCK)
            except zmq.ZMQError as e:  # the asker went away
                log.debug("kvbm: P/D reply not sent: %s", e)

    def _answer(self, h: Dict[str, Any]) -> List[bytes]:
        op, req_id = h.get("op"), h.get("req")
        if not isinstance(req_id, str):
            return [json.dumps({"ok": False, "why": "malformed request"}).encode()]
        if h.get("engine") != self.engine_id:
            return [json.dumps({"ok": False, "why": f"this is engine {self.engine_id}, "
                                                    f"not {h.get('engine')}"}).encode()]
        with self._lock:
            if op == "pull":
                lease = h.get("lease_s")
                if not isinstance(lease, (int, float)) or not 0 <= lease < 1e6:
                    return [json.dumps({"ok": False, "why": "malformed lease"}).encode()]
                hold = self._held.get(req_id)
                if hold is not None:
                    token = uuid.uuid4().hex
                    hold.leases[token] = time.monotonic() + lease + _LEASE_MARGIN_S
                    return [json.dumps({"ok": True, "token": token}).encode(), self._md]
                if req_id in self._gone:
                    return [json.dumps({"ok": False, "why": "released"}).encode()]
                # Not held yet: vLLM answered the client before this worker's
                # next step told it; the decode side asks again.
                return [json.dumps({"ok": False, "retry": True}).encode()]
            if op == "done":
                hold = self._held.get(req_id)
                if hold is not None:
                    token = h.get("token")
                    if isinstance(token, str):
                        hold.leases.pop(token, None)
                    hold.done = True
                    if not hold.leased(time.monotonic()):
                        del self._held[req_id]
                        self._let_go(req_id)
                    return [json.dumps({"ok": True}).encode()]
                if req_id in self._gone:
                    return [json.dumps({"ok": False, "why": "released"}).encode()]
                self._early[req_id] = None
                while len(self._early) > _GONE_KEPT:
                    self._early.popitem(last=False)
                return [json.dumps({"ok": True}).encode()]
        return [json.dumps({"ok": False, "why": f"unknown op {op!r}"}).encode()]


class _Unanswered(HandoffRefused):
    """The prefill worker did not answer before the deadline."""


class _Refused(HandoffRefused):
    """The prefill worker answered no."""


class _Pull(HandoffSide):
    """One request's hand-off, on the side channel: the prefill ran before
    the decode heard of it, the pull takes a lease, the release ends it."""

    def __init__(self, puller: "DecodePuller", p: RemotePull, deadline: float) -> None:
        self.puller, self.p, self.deadline = puller, p, deadline
        self.lease: Dict[str, Any] = {}  # the prefill's answer to our pull (its token)

    def submit_prefill(self, h: Handoff) -> None:
        # The prefill ran: its kv_transfer_params say it holds the KV.
        h.fact(FactKind.SOURCE_HELD)

    def start_transfer(self, h: Handoff) -> None:
        p = self.p
        inst = self.puller._lease(p, self.deadline, self.lease)
        h.pull(self.puller._worker, inst, p.remote_block_ids, p.block_ids)

    def release_source(self, h: Handoff) -> OutcomeKind:
        return self.puller._release(self.p, max(self.deadline, time.monotonic() +
                                                _RELEASE_MIN_S), self.lease)

    def cancel_source(self, h: Handoff) -> OutcomeKind:
        self.puller._release(self.p, time.monotonic(), self.lease)  # best effort, no wait
        return OutcomeKind.APPLIED


class DecodePuller:
    """The decode worker's side: runs each request's pull in a small thread
    pool, as a hand-off (kvbmgo._pd.Handoff) bounded by timeout_s.
    ``finished()`` collects the pulls that ended."""

    def __init__(self, worker: Any, rank: int, tp_size: int, timeout_s: float,
                 max_pulls: int) -> None:
        import zmq
        self._worker = worker
        self.rank, self.tp_size, self.timeout_s = rank, tp_size, timeout_s
        self._ctx = zmq.Context()
        self._pool = ThreadPoolExecutor(max_pulls, thread_name_prefix="kvbm-pd-pull")
        self._lock = threading.Lock()
        self._md: Dict[Tuple[str, int], bytes] = {}   # connected prefill workers
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
        if not p.block_ids:
            self._release(p, deadline, {})
            return []
        h = Handoff(HandoffOrder.SOURCE_FIRST, _Pull(self, p, deadline), deadline,
                    name=f"kvbm: pull of request {p.req_id} from engine {p.engine_id}",
                    bound=f"its {self.timeout_s:.1f} s deadline")
        try:
            h.start()
        finally:
            h.close()
        if h.transfer_error is not None:
            with self._lock:  # connect again next time (a restarted prefill)
                self._md.pop((p.engine_id, self.rank), None)
        return [] if h.completion == Completion.SUCCESS else list(p.block_ids)

    def _lease(self, p: RemotePull, deadline: float, lease: Dict[str, Any]) -> int:
        """Asks p's prefill worker for a lease on its blocks (its answer goes
        into lease) and connects to it: the instance to pull from."""
        if p.tp_size != self.tp_size:
            raise _Refused(f"the prefill has tensor-parallel size {p.tp_size}, this decode "
                           f"{self.tp_size}: kvbm pulls rank to rank")
        if len(p.remote_block_ids) != len(p.block_ids):
            raise _Refused(f"{len(p.remote_block_ids)} remote blocks for "
                           f"{len(p.block_ids)} local ones")
        head, md = self._ask(p, {"op": "pull", "req": p.remote_request_id,
                                 "engine": p.engine_id,
                                 "lease_s": max(0.0, deadline - time.monotonic())},
                             deadline, retry=True)
        if not head.get("ok") or md is None:
            raise _Refused(f"the prefill refused: {head.get('why', 'no reason')}")
        lease.update(head)
        key = (p.engine_id, self.rank)
        inst = instance_id(*key)
        with self._lock:
            if self._md.get(key) != md:
                try:
                    self._worker.connect_remote(inst, md)
                except AlreadyExistsError:
                    pass
                self._md[key] = md
        return inst

    def _release(self, p: RemotePull, deadline: float, lease: Dict[str, Any]) -> OutcomeKind:
        """Tells the prefill it may let go of p's blocks: APPLIED once it
        says so, NOOP when it cannot be reached by the deadline (it lets
        go by itself after pd_hold_s), FAILED when it had let go already."""
        try:
            head, _ = self._ask(p, {"op": "done", "req": p.remote_request_id,
                                    "engine": p.engine_id, "token": lease.get("token")},
                                deadline, retry=False)
        except _Unanswered as e:
            log.info("kvbm: release of request %s: %s", p.req_id, e)
            return OutcomeKind.NOOP
        if head.get("ok"):
            return OutcomeKind.APPLIED
        log.warning("kvbm: release of request %s: the prefill says %s", p.req_id,
                    head.get("why"))
        return OutcomeKind.FAILED

    def _ask(self, p: RemotePull, header: Dict[str, Any], deadline: float, *, retry: bool
             ) -> Tuple[Dict[str, Any], Optional[bytes]]:
        """One request to p's prefill worker, answered by the deadline (a
        deadline already past: sent, not waited for). retry: ask again
        while the prefill answers {"retry": true}."""
        import zmq
        addr = f"tcp://{p.host}:{p.port + self.rank}"
        delay = 0.005
        while True:
            s = self._ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0 if deadline > time.monotonic() else 200)
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
