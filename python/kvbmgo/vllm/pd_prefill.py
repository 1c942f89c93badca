"""The prefill worker's side of KvbmConnector's P/D side channel
(pd_wire.py): it holds each finished request's blocks for the decode
instances that pull them, grants their leases and lets go once they are
done, answering on a thread of its own.

Trust (docs/vllm.md, "P/D"): the prefill's scheduler draws a 128-bit random
token per request (``_control.new_token``) and returns it in the request's
kv_transfer_params (``kvbm_token``). Both messages carry it; one without
it, with a wrong one (compared in constant time: ``_control.same_token``),
or naming another engine is answered exactly as a request the prefill does
not hold, so an asker without the token learns nothing (neither the
metadata, nor the engine id, nor whether the request exists) and releases
nothing, not even a request held later. A pull is answered with metadata
that reads that request's G1 blocks only, until its lease ends
(``pd_request_metadata``), and no longer once the request is let go: its
blocks are revoked (``pd_revoke``, kvbm_worker_revoke_blocks) before they
are reported released, so metadata a decode (or anyone it leaked to)
still holds never reads the blocks' next request. The socket caps a frame
at pd_wire.REQUEST_MAX. Before any of that, a message must verify under
the side channel's key (pd_wire.Auth: the deployment key or the same-host
one) and name this rank; one that does not is answered with why only. A
lease is the prefill's: at most min(pd_hold_s, pd_max_lease_s), whatever a
pull asks, and never past the hold plus that bound.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .. import _control
from .._layout import Tier
from . import pd_wire as wire

__all__ = ["PrefillServer", "pd_metadata", "pd_request_metadata", "pd_revoke"]

log = logging.getLogger(__name__)

#: How long the prefill's lease outlasts the decode side's deadline.
_LEASE_MARGIN_S = 5.0
#: Requests the prefill remembers as let go (to answer a late pull "released").
_GONE_KEPT = 4096
#: Seconds between two warnings about refused messages.
_REFUSED_LOG_S = 10.0
#: The side channel's thread not run for this long past its poll's timeout
#: is logged (the process starved of CPU, or another thread held the GIL).
_STALL_S = 1.0


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


def pd_revoke(worker: Any, block_ids: List[int]) -> None:
    """Ends every request's metadata (pd_request_metadata) that reads one of
    block_ids, once no read it allowed is under way: called before the
    blocks go back to vLLM for another request."""
    worker.revoke_blocks({Tier.G1: list(block_ids)})


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


class PrefillServer:
    """The prefill worker's side of the channel: a zmq ROUTER bound to
    tcp://host:port, served by one daemon thread. Holds the requests whose
    blocks wait for a decode instance."""

    def __init__(self, metadata: bytes, engine_id: str, host: str, port: int,
                 hold_s: float, kv: Optional[Dict[str, Any]] = None,
                 scoped: Optional[Any] = None,
                 revoke: Optional[Callable[[List[int]], None]] = None, *,
                 key: Optional[_control.KeyChoice] = None,
                 max_lease_s: Optional[float] = None) -> None:
        """key: the side channel's (_control.choose_key for host by default);
        max_lease_s: the longest lease granted (with hold_s: the shorter)."""
        import zmq
        self.engine_id = engine_id
        self.address = f"tcp://{host}:{port}"
        key = key or _control.choose_key(wire.LABEL, [host])
        self._auth = wire.Auth(key.key, engine_id, "prefill",
                               me=wire.prefill_name(engine_id, port))
        # The longest lease a pull gets, whatever it asks: the holder's bound.
        self._max_lease_s = min(hold_s, max_lease_s) if max_lease_s else hold_s
        self._md = metadata
        # This rank's KV as the pull reply describes it (kv_views.LocalKv.describe).
        self._kv = kv
        # scoped(block_ids, expires_s) -> the metadata of a request's blocks
        # only (pd_request_metadata); None: metadata for every request.
        self._scoped = scoped
        # revoke(block_ids): ends the scoped metadata of blocks let go (pd_revoke)
        self._revoke = revoke
        self._revoke_pending: List[int] = []       # blocks let go, not yet revoked
        self._hold_s = hold_s
        self._lock = threading.Lock()
        self._held: Dict[str, _Hold] = {}
        self._released: Set[str] = set()           # let go, not yet reported
        self._gone: "OrderedDict[str, str]" = OrderedDict()  # let go: req -> token
        # done before held, by (req, token): only the request's token lets go of
        # it then; the decode ranks that said so, and how many read it
        self._early: "OrderedDict[Tuple[str, str], Tuple[Set[str], int]]" = OrderedDict()
        self._suspended: Optional[str] = None      # why pulls are refused (suspend)
        self.refused = 0                           # messages with a wrong token
        self._refused_logged = 0.0
        self._trouble_logged = 0.0                 # the last stall or error logged
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        _control.cap_frames(self._sock, wire.REQUEST_MAX)  # larger: refused, not read
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
                    self._let_go(req_id, token, h.blocks)
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
                self._let_go(req_id, h.token, h.blocks)
            out, self._released = self._released, set()
            revoke, self._revoke_pending = self._revoke_pending, []
            # A block another held request shares (vLLM's prefix cache) keeps
            # its bytes while that one is held: revoked when it is let go.
            if revoke:  # (most steps let nothing go)
                live = {b for h in self._held.values() for b in (h.blocks or ())}
                revoke = sorted(set(revoke) - live)
        # Revoked before vLLM hears they are released (and may give them to
        # another request); outside the lock: the revocation waits for reads
        # of them under way, and the channel keeps answering meanwhile.
        if revoke and self._revoke is not None:
            try:
                self._revoke(revoke)
            except Exception as e:  # noqa: BLE001 - the blocks must go back all the same
                log.error("kvbm: P/D: the metadata of %d released blocks could not be "
                          "revoked (%s); they are released all the same", len(revoke), e)
        # Logged outside the lock: a slow log handler never holds up the channel.
        for req_id in expired:
            log.warning("kvbm: no decode instance was done with request %s within its hold; "
                        "its blocks are freed", req_id)
        return out

    def suspend(self, why: str) -> None:
        """The engine takes its KV cache away (vLLM's sleep mode, a weight
        update): every request held is let go now (reported by the next
        take_released), and every pull is refused with why until resume.
        The held requests' scoped metadata needs no revocation: it names
        the G1 registration the worker withdraws, which no pull reaches
        any more."""
        with self._lock:
            self._suspended = why
            for req_id, h in list(self._held.items()):
                del self._held[req_id]
                self._let_go(req_id, h.token)
            self._revoke_pending = []
        log.info("kvbm: P/D side channel of engine %s: pulls refused: %s", self.engine_id, why)

    def resume(self, metadata: bytes) -> None:
        """The KV cache is back: pulls are answered again, with metadata of
        the worker's new registration (pd_metadata)."""
        with self._lock:
            self._md = metadata
            self._suspended = None

    def _let_go(self, req_id: str, token: str, blocks: Optional[List[int]] = None) -> None:
        if blocks:
            self._revoke_pending.extend(blocks)
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
        # From a REQ socket: [identity, b"", header, authentication frames];
        # nothing else is answered.
        if len(frames) < 3 or frames[1]:
            return
        got, why = self._auth.verify(frames[2:])
        if got is None:  # not acted on: answered why, nothing else
            reply = wire.unauthenticated(why)
            h: Dict[str, Any] = {"op": "refused"}
        elif len(got.frames) != 1:
            return
        else:
            h = wire.header(got.frames[0])
            reply = self._answer(h)
            if got.nonce is not None:
                reply = self._auth.sign(reply, wire.reply_to(got.nonce))
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
            return wire.refusal("malformed request")
        if not isinstance(token, str):
            token = ""  # proves nothing: answered as for a request not held
        # Another engine's request is one this engine does not hold.
        ours = h.get("engine") == self.engine_id
        with self._lock:
            hold = self._held.get(req_id) if ours else None
            gone = self._gone.get(req_id) if ours else None
            if hold is not None and not _control.same_token(token, hold.token):
                self._refuse(req_id)
                hold = None
            if gone is not None and not _control.same_token(token, gone):
                self._refuse(req_id)
                gone = None
            known = (req_id in self._held or req_id in self._gone) if ours else False
            if op == "pull" and self._suspended is not None and ours:
                return wire.refusal(f"unavailable: {self._suspended}")
            if op == "pull":
                lease = wire.lease_s(h)
                if lease is None:
                    return wire.refusal("malformed lease")
                if hold is not None:
                    lease = self._bound(lease, hold)
                    md, scoped = self._pull_metadata(req_id, hold, lease + _LEASE_MARGIN_S)
                    if md is None:
                        return wire.refusal("no metadata")
                    lease_id = uuid.uuid4().hex
                    hold.leases[lease_id] = time.monotonic() + lease + _LEASE_MARGIN_S
                    head = self._pull_head(lease_id)
                    head["scoped"] = scoped
                    head["lease_s"] = lease
                    return wire.answer(head, md)
                if gone is not None:
                    return wire.refusal("released")
                # Not held yet (vLLM answered the client before this worker's
                # next step told it; the decode side asks again), or not
                # this asker's to know.
                return wire.NOTHING
            # done
            if hold is not None:
                lease_id = h.get("lease")
                if isinstance(lease_id, str):
                    hold.leases.pop(lease_id, None)
                who, hold.consumers = wire.done_by(h)
                hold.done_by.add(who)
                if hold.done and not hold.leased(time.monotonic()):
                    del self._held[req_id]
                    self._let_go(req_id, hold.token, hold.blocks)
                return wire.accepted()
            if gone is not None:
                return wire.refusal("released")
            if ours and not known and token:
                # Before the prefill holds it: let go as it is held, if token is its.
                who, n = wire.done_by(h)
                seen = self._early.get((req_id, token), (set(), n))[0]
                if len(seen) < wire.MAX_CONSUMERS:
                    seen.add(who)
                self._early[(req_id, token)] = (seen, n)
                while len(self._early) > _GONE_KEPT:
                    self._early.popitem(last=False)
            return wire.accepted()

    def _bound(self, asked: float, hold: _Hold) -> float:
        """The lease a pull of hold gets for asked seconds: at most the
        prefill's bound, and never ending past the hold plus that bound (a
        pull asked again and again does not keep the blocks for ever)."""
        left = hold.until + self._max_lease_s - time.monotonic()
        return max(0.0, min(asked, self._max_lease_s, left))

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
        if self._scoped is None:
            return self._md, False
        if not hold.blocks:  # nothing to read: nothing wider goes out either
            return None, False
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

