"""The decode worker's side of KvbmConnector's P/D side channel
(pd_wire.py): each request's pull from the prefill ranks that hold its KV,
between equal tensor-parallel sizes rank to rank, between different ones
as tp_mapping.plan routes them (the heads a read takes of a prefill rank's
blocks pulled as a head slice, kv_views.LocalKv.head_slice).

The decode side drives each pull with kvbmgo's P/D driver
(``kvbmgo._pd.Handoff``, in vLLM's order: source first) and bounds it by
``pd_timeout_s``: a prefill that does not answer, or a transfer that fails
or outlasts the deadline (the library cancels it then), fails every block
of the request (reported by ``get_block_ids_with_load_errors``). A transfer
is waited for until it ended before the request is reported, so that vLLM
never reuses blocks the library may still write; the bytes of one that
outlasted the deadline are never trusted.

Trust (docs/vllm.md, "P/D"): the decode dials only the hosts
``pd_allow_hosts`` allows (any by default; ``_control.AllowList``), caps
the replies it reads (pd_wire.REPLY_MAX), checks that the metadata it got
is of the worker of the engine id and rank it asked for
(``Worker.exporter_id``), and runs each transfer against the metadata that
pull got (pd_connections.py). It signs each ask for the prefill rank it
dials (pd_wire.Auth, pd_wire.prefill_name) and takes only an answer signed
for that ask (pd_wire.reply_to); with the same-host key (no
KVBM_AUTH_KEY), it dials loopback addresses only.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Set, Tuple

from .. import _control
from .._handoff import Completion, FactKind, HandoffOrder, OutcomeKind
from .._pd import Handoff, HandoffSide
from .._worker import Worker
from . import pd_wire as wire
from .metadata import RemotePull
from .pd_connections import Conn, Connections
from .pd_groups import log_refusal
from .pd_wire import Refused, Unanswered
from .tp_mapping import Plan, Read, owned, plan, refusal

__all__ = ["DecodePuller"]

log = logging.getLogger(__name__)

#: A release after a successful pull gets at least this long for its answer.
_RELEASE_MIN_S = 1.0


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


class _Source:
    """One prefill rank of a pull: its side channel, the lease it granted,
    and the connection (on the decode worker's connections) its transfer
    runs against."""
    __slots__ = ("rank", "addr", "lease", "conn")

    def __init__(self, rank: int, addr: str) -> None:
        self.rank, self.addr = rank, addr
        self.lease: Dict[str, Any] = {}
        self.conn: Optional[Conn] = None

    def connect(self, conns: Connections, wid: int, md: bytes, deadline: float,
                stop: threading.Event) -> Conn:
        """Connects to the metadata its lease carried, on conns: a request's
        own (scoped) instance when the lease says the metadata covers that
        request's blocks only."""
        if self.lease.get("scoped") is True:
            return conns.acquire_scoped(wid, md, deadline, stop)
        return conns.acquire(wid, md, deadline, stop)


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
        for read in self.plan.reads:
            src = self.sources[read.rank]
            wid, md, kv = puller._lease(p, src, self.deadline)
            src.conn = src.connect(puller._conns, wid, md, self.deadline, puller._stop)
            # Straight into G1: whole blocks, or the heads this rank takes
            # of the prefill rank's (the library plans the slice's ranges).
            heads = None if puller._direct(p, read, kv) else puller._local.head_slice(read, kv)
            h.pull(puller._worker, src.conn.inst, p.remote_block_ids, p.block_ids, heads=heads)

    def release_source(self, h: Handoff) -> OutcomeKind:
        return self.puller._release_all(self.p, self.plan, self.sources,
                                        max(self.deadline, time.monotonic() + _RELEASE_MIN_S))

    def cancel_source(self, h: Handoff) -> OutcomeKind:
        # best effort, no wait
        self.puller._release_all(self.p, self.plan, self.sources, time.monotonic())
        return OutcomeKind.APPLIED


class DecodePuller:
    """The decode worker's side: runs each request's pull in a small thread
    pool, as a hand-off (kvbmgo._pd.Handoff) bounded by timeout_s.
    ``finished()`` collects the pulls that ended."""

    def __init__(self, worker: Any, rank: int, tp_size: int, timeout_s: float,
                 max_pulls: int, allow_hosts: Optional[Tuple[str, ...]] = None, *,
                 local: Any = None, engine_id: str = "",
                 key: Optional[_control.KeyChoice] = None, by_request: bool = False) -> None:
        """local: this worker's KV (kv_views.LocalKv; None: pulls rank to rank
        only, as before heterogeneous TP); engine_id: this decode's (its
        done messages say which decode rank they are from); key: the side
        channel's (_control.choose_key for allow_hosts by default);
        by_request: a failed pull is its request's (take_failed_requests),
        not its blocks' (several KV cache groups: vLLM takes no block ids)."""
        import zmq
        self._worker = worker
        self.rank, self.tp_size, self.timeout_s = rank, tp_size, timeout_s
        self._local = local
        self._me = f"{engine_id}/{rank}"
        self._key = key or _control.choose_key(wire.LABEL, allow_hosts or ())
        self._auth = wire.Auth(self._key.key, self._me, "decode")
        self._max_pulls = max_pulls
        self._refused_pairs: Set[Tuple[str, int]] = set()  # (engine, tp): logged once each
        self._ctx = zmq.Context()
        self._pool = ThreadPoolExecutor(max_pulls, thread_name_prefix="kvbm-pd-pull")
        self._lock = threading.Lock()
        self._conns = Connections(worker)
        # pd_allow_hosts; None: any host.
        self._allow = None if allow_hosts is None else _control.AllowList(allow_hosts)
        self._refused_hosts: Set[Tuple[str, str]] = set()  # (host, why): logged once each
        self._pending: Dict[str, Tuple[Future, List[int]]] = {}
        self._by_request = by_request
        self._refused: Set[str] = set()      # pulls refused (RemotePull.refused)
        self._failed_reqs: Set[str] = set()  # failed as requests, not yet taken
        self._failed_req_ids: Set[int] = set()
        self._stop = threading.Event()

    def start(self, pull: RemotePull) -> None:
        """Starts pull in the background (a release alone when it has no blocks)."""
        deadline = time.monotonic() + self.timeout_s
        if pull.refused and pull.block_ids:
            self._refused.add(pull.req_id)
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
                lost = list(fut.result())
            except Exception:  # noqa: BLE001 - a bug in a pull: fail it closed
                log.exception("kvbm: pull of request %s", req_id)
                lost = ids
            failed.update(lost)
            if lost and (self._by_request or req_id in self._refused):
                self._failed_reqs.add(req_id)
                self._failed_req_ids.update(lost)
            self._refused.discard(req_id)
        return done, failed

    def take_failed_requests(self) -> Tuple[Set[str], Set[int]]:
        """(the requests among those finished() reported whose pull failed
        as a request's: refused, or any with by_request; their G1 blocks,
        which finished() counted among the failed ones)."""
        reqs, ids = self._failed_reqs, self._failed_req_ids
        self._failed_reqs, self._failed_req_ids = set(), set()
        return reqs, ids

    def close(self) -> None:
        """Ends the handshakes still waiting, waits for the transfers in flight."""
        self._stop.set()
        self._pool.shutdown(wait=True)
        self._ctx.term()

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
        if p.refused:  # pd_groups.pairs: said once per prefill engine and reason
            log_refusal(p.req_id, p.engine_id, p.refused)
            why = p.refused
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
                    self._conns.release(src.conn, h.transfer_error is not None)
        return [] if h.completion == Completion.SUCCESS else list(p.block_ids)

    def _plan(self, p: RemotePull) -> Tuple[Plan, Optional[str]]:
        """The reads of p (tp_mapping.plan), or, for a pair of TP sizes that
        cannot be mapped, (the prefill ranks this rank answers for, why):
        logged once per prefill engine and size, with both sizes."""
        local = self._local
        if p.refused:  # pd_groups.pairs refused it (and says so): no mapping to try
            ranks = tuple(owned(self.rank, self.tp_size, p.tp_size)) if p.tp_size >= 1 else ()
            return Plan((), ranks, {q: 1 for q in ranks}), p.refused
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
            allowed = self._allow.address(host, port)  # the address checked, not the name
            if allowed is None:
                why = "pd_allow_hosts does not allow it"
            else:
                host = allowed
        if not why:
            why = self._key.may_dial(host) or ""
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
            raise Refused(f"{len(p.remote_block_ids)} remote blocks for "
                           f"{len(p.block_ids)} local ones")
        head, md = self._ask(addr, p, wire.pull(p, max(0.0, deadline - time.monotonic())),
                             deadline, retry=True)
        if not head.get("ok") or md is None:
            raise Refused(f"the prefill refused: {head.get('why', 'no reason')}")
        src.lease.update(head)
        wid = Worker.exporter_id(md)
        if not _expected_worker(p, src.rank, wid):
            raise Refused(f"{addr} answered the metadata of worker "
                           f"{'(none)' if wid is None else format(wid, 'x')}, not one of "
                           f"engine {p.engine_id!r} rank {src.rank}")
        kv = head.get("kv")
        kv = kv if isinstance(kv, dict) else None
        if kv is not None and self._local is not None:
            bad = self._local.mismatch(kv, p.tp_size, src.rank)
            if bad is not None:
                raise Refused(f"rank {src.rank} of the prefill describes KV this decode "
                               f"cannot take: {bad}")
        elif p.tp_size != self.tp_size:
            raise Refused(f"the prefill has tensor-parallel size {p.tp_size}, this decode "
                           f"{self.tp_size}, and its rank {src.rank} does not describe its KV "
                           f"(a kvbm older than heterogeneous TP)")
        return wid, md, kv

    def _direct(self, p: RemotePull, read: Read, kv: Optional[Dict[str, Any]]) -> bool:
        """Whether read's source blocks hold exactly this decode's blocks
        (whole blocks), or only part of them or another part (a head slice)."""
        local = self._local
        if kv is None or local is None:
            return True  # equal TP, from a prefill that does not describe its KV
        return (read.src == (0, kv["heads"]) and read.dst == (0, local.heads)
                and (local.heads == 1 or kv["order"] == local.order))

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
            head, _ = self._ask(addr, p, wire.done(p, lease.get("lease"), self._me, consumers),
                                deadline, retry=False)
        except Unanswered as e:
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
        to = wire.prefill_name(p.engine_id, int(addr.rpartition(":")[2]))
        while True:
            s = self._ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0 if deadline > time.monotonic() else 200)
            _control.cap_frames(s, wire.REPLY_MAX)  # a larger reply: never read
            s.setsockopt(zmq.IPV6, 1)
            nonce = _control.new_token()  # the answer must name this ask
            try:
                s.connect(addr)
                s.send_multipart(self._auth.sign([wire.frame(header)], to, nonce))
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
                raise Unanswered(f"{addr} did not answer within the deadline" + (
                    f" (it had answered {not_held} asks that it did not hold request "
                    f"{p.remote_request_id} yet)" if not_held else " (no answer at all)"))
            got, why = self._auth.verify(frames, wire.reply_to(nonce))
            if got is None or not got.frames:
                # Not taken: its "why" (a prefill refusing the ask, unsigned) is
                # quoted, nothing else of it is used.
                said = wire.header(frames[0]).get("why") if frames else None
                return {"ok": False, "why": f"its answer was refused ({why or 'empty'})" + (
                    f"; it said {str(said)[:300]!r}" if said else "")}, None
            frames = got.frames
            head = wire.header(frames[0])
            if retry and head.get("retry"):
                not_held += 1
                if time.monotonic() + delay >= deadline or self._stop.is_set():
                    raise Unanswered(f"{addr} did not hold request {p.remote_request_id} "
                                      f"by the deadline ({not_held} asks answered so)")
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
                continue
            return head, (frames[1] if len(frames) > 1 else None)
