"""The decode side of kvbm's SGLang PD backend: each request's hand-off,
driven by kvbmgo's P/D driver (``kvbmgo._pd.Handoff``) in SGLang's order
(destination first): ReserveDestination (the decode reserved pages),
SubmitPrefill (KVBM_ROOM sent), SourceHeld (the last KVBM_PULL came),
StartTransfer (the pull of what is left: the pages of earlier chunks are
pulled as they come, overlapping the prefill's next chunks),
TransferCompleted (every pull of the request done), ActivateDestination
(aux row written, Success), ReleaseSource (KVBM_DONE); a failure, timeout
or abort runs CancelSource (KVBM_DONE with the reason) and
CancelDestination (the pulls canceled and ended, then Failed).

Every pull is bounded by SGLANG_DISAGGREGATION_WAITING_TIMEOUT from
send_metadata (the library cancels one still running then), as is the
request (``KvbmKVReceiver._poll``).

The decode holds no capability of the prefill worker as a whole: each
KVBM_PULL brings metadata that reads that chunk's pages only (per piece of
the chunk, pd_wire.scope_pieces); it is connected under an instance of the
room's own, through which the piece's pages are pulled, and disconnected
when the room ends. The prefill revokes it then too. The last KVBM_PULL
brings the room's state slots (pd_state) the same way, one instance per
state component; they are checked against the slots this decode reserved
and pulled at StartTransfer with the pages still to come, so the room is
Success only once both arrived."""

from __future__ import annotations

import ctypes
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from sglang.srt.disaggregation.base.conn import KVPoll, KVTransferDestination
from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVReceiver

from .._control import endpoint
from .._handoff import FactKind, HandoffOrder, OutcomeKind, TimingMode
from .._pd import Handoff, HandoffRefused, HandoffSide
from ..errors import KvbmError
from . import pd_state
from . import pd_wire as wire

__all__ = ["DecodeSide", "KvbmKVReceiver"]

logger = logging.getLogger(__name__)


class _DecodeRoom(HandoffSide):
    """One request's hand-off on the decode side."""

    def __init__(self, side: "DecodeSide", room: int, dst: np.ndarray,
                 aux_index: Optional[int], targets: List[Tuple[str, int]], submit: Any,
                 state_dst: List[np.ndarray]) -> None:
        self.side = side
        self.room = room
        self.dst = dst
        self.state_dst = state_dst  # this decode's slots per state component
        # (component, the prefill's slots, instance), from the last KVBM_PULL
        self.states: List[Tuple[int, np.ndarray, int]] = []
        self.aux_index = aux_index
        self.targets = targets
        self.submit = submit
        self.submitted = False
        # (dst offset, source pages, pieces: (offset in the chunk, pages, instance))
        self.chunks: List[Tuple[int, np.ndarray, List[Tuple[int, int, int]]]] = []
        self.instances: List[int] = []  # connected for the room's metadata
        self.closed = False  # disconnected: connects nothing more
        self.pulled = 0  # chunks whose pull started
        self.token: Optional[str] = None  # the prefill rank the pages come from
        self.aux_rows: Optional[List[bytes]] = None
        timeout = side.mgr.waiting_timeout
        self.handoff = Handoff(
            HandoffOrder.DESTINATION_FIRST, self, time.monotonic() + timeout,
            name=f"kvbm transfer backend: the pull of room {room}",
            bound=f"SGLANG_DISAGGREGATION_WAITING_TIMEOUT ({timeout}s)", executor=side.pool)

    def submit_prefill(self, h: Handoff) -> None:
        ok, why = self.submit()
        self.submitted = ok
        if not ok:
            raise HandoffRefused(why)

    def start_transfer(self, h: Handoff) -> None:
        self.side.pull(self, self.chunks[self.pulled:])
        self.pulled = len(self.chunks)
        self.side.pull_states(self)

    def activate_destination(self, h: Handoff) -> None:
        self.side.write_aux(self)
        self.side.mgr.update_status(self.room, KVPoll.Success)

    def release_source(self, h: Handoff) -> OutcomeKind:
        self.disconnect()  # every pull ended (TransferCompleted)
        self.side.done(self, KVPoll.Success, "")
        return OutcomeKind.APPLIED

    def cancel_source(self, h: Handoff) -> OutcomeKind:
        if not self.submitted:
            return OutcomeKind.NOOP
        self.side.done(self, KVPoll.Failed, h.reason or "decode gave up")
        return OutcomeKind.APPLIED

    def connect(self, src: np.ndarray,
                scopes: List[wire.Scope]) -> List[Tuple[int, int, int]]:
        """Connects the scoped metadata of a chunk's pages src, each piece under an instance
        of its own (with the handoff's lock held); the pieces. Raises
        HandoffRefused."""
        workers = self.side.mgr.workers
        if sum(n for n, _ in scopes) != len(src) or any(n <= 0 for n, _ in scopes):
            raise HandoffRefused(f"the prefill's metadata covers pieces {[n for n, _ in scopes]}"
                                 f" of a chunk of {len(src)} pages")
        pieces, off = [], 0
        for n, mds in scopes:
            if len(mds) != len(workers):
                raise HandoffRefused(f"the prefill sent the metadata of {len(mds)} workers, "
                                     f"this decode has {len(workers)}")
            pieces.append((off, n, self._connect(workers, mds, "pages")))
            off += n
        return pieces

    def _connect(self, workers: List[Any], mds: List[bytes], what: str) -> int:
        """Connects each worker's metadata under a new instance of the room
        (disconnected with it, even if half made); the instance. Raises
        HandoffRefused."""
        inst = next(self.side.next_instance)
        self.instances.append(inst)
        try:
            for w, md in zip(workers, mds):
                w.connect_remote(inst, md)
        except KvbmError as e:
            raise HandoffRefused(f"connecting the metadata of room {self.room}'s {what} "
                                 f"failed: {e}") from e
        return inst

    def connect_states(self, states: List[pd_state.StateScope]) -> None:
        """Connects the prefill's state metadata (with the handoff's lock
        held), each component's under an instance of its own, after checking
        that every component this decode reserved slots in comes, as many
        slots, none other. Raises HandoffRefused."""
        mgr = self.side.mgr
        got = pd_state.by_component(states)
        if len(got) != len(states) or not set(got) <= set(range(len(mgr.states))):
            raise HandoffRefused(f"the prefill sent state components {sorted(got)}, this "
                                 f"decode has {len(mgr.states)}")
        for c in mgr.states:
            src = got[c.index][1] if c.index in got else np.zeros(0, np.int32)
            why = pd_state.check_pair(c, src, self.state_dst[c.index])
            if why is not None:
                raise HandoffRefused(why)
        for c, src, mds in states:
            workers = mgr.state_workers.get(c, [])
            if len(mds) != len(workers):
                raise HandoffRefused(f"the prefill sent the metadata of {len(mds)} workers "
                                     f"for state {c}, this decode has {len(workers)}")
            self.states.append((c, src, self._connect(workers, mds, f"state {c}")))

    def disconnect(self) -> None:
        """Forgets the room's metadata (after its pulls ended or were
        canceled); nothing is connected for the room afterwards."""
        with self.handoff.lock:
            self.closed = True
            instances, self.instances = self.instances, []
        for inst in instances:
            for w in self.side.mgr.all_workers:
                try:
                    w.disconnect_remote(inst)
                except KvbmError:
                    pass  # not connected on this worker (a connect that failed)

    def cancel_destination(self, h: Handoff) -> None:
        mgr = self.side.mgr
        if self.room in mgr.request_status:
            mgr.record_failure(self.room, h.reason or "kvbm transfer failed")
            mgr.update_status(self.room, KVPoll.Failed)


class DecodeSide:
    """The decode side of a KvbmKVManager (mgr)."""

    def __init__(self, mgr: CommonKVManager) -> None:
        self.mgr = mgr  # a KvbmKVManager
        # prefill token -> None (its layouts are this decode's) or why not
        self.layouts: Dict[str, Optional[str]] = {}
        self.prefills: Dict[str, Tuple[str, int]] = {}  # prefill token -> its endpoint
        self._nonces: Dict[str, None] = {}  # of the registrations sent (the newest 1024)
        self._nonces_lock = threading.Lock()
        self.next_instance = itertools.count(1)  # one per piece of a room's metadata
        self.rooms: Dict[int, _DecodeRoom] = {}
        self._rooms_lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kvbm-pull")

    def close(self) -> None:
        """Ends every hand-off (their pulls canceled and ended), then the pool."""
        with self._rooms_lock:
            rooms, self.rooms = list(self.rooms.values()), {}
        for r in rooms:
            r.handoff.close()
            r.disconnect()
        self.pool.shutdown(wait=True)

    # ---- messages

    def expect_layouts(self, nonce: str) -> None:
        """A KVBM_REG with nonce goes out: a KVBM_META repeating it is taken."""
        with self._nonces_lock:
            self._nonces[nonce] = None
            while len(self._nonces) > 1024:
                del self._nonces[next(iter(self._nonces))]

    def _from_room_prefill(self, msg: List[bytes], room: int, token: Optional[str],
                           r: Optional[_DecodeRoom]) -> bool:
        """Whether a message about room comes from a prefill rank the
        bootstrap server assigned to it (token: the prefill's name)."""
        if r is None:
            return True  # not ours (any more): nothing to change
        ep = self.prefills.get(token) if token is not None else None
        if ep is not None and ep in r.targets:
            return True
        self.mgr.auth.refuse(msg, "not the room's prefill", f"prefill {(token or '?')[:8]} "
                             f"({ep or 'never registered'}) is not one the bootstrap server "
                             f"assigned to room {room}", f"token {(token or '?')[:8]}")
        return False

    def on_message(self, msg: List[bytes], sender: Optional[str] = None) -> None:
        """One control message; sender: the token its authentication names
        (None without a key), which must be the one the message names."""
        mgr = self.mgr
        tag = msg[0]
        if tag == wire.TAG_META:
            self._on_layouts(msg, sender)
        elif tag == wire.TAG_PULL:
            self._on_pull(msg, sender)
        elif mgr.handle_abort_ack_message(msg):
            pass
        else:
            parsed = mgr.parse_kv_status_message(msg)
            if parsed is None:
                logger.warning("kvbm transfer backend (decode): unexpected message %r",
                               tag[:20])
                return
            room, status, prefill_rank, reason = parsed
            # SGLang's status message names no sender: with a key, the
            # authenticated one must be the room's prefill.
            if sender is not None and not self._from_room_prefill(msg, room, sender,
                                                                  self.rooms.get(room)):
                return
            mgr.apply_prefill_status(bootstrap_room=room, status=status,
                                     prefill_rank=prefill_rank, failure_reason=reason)
            if status == KVPoll.Failed:
                self.fact(room, FactKind.FAILED, reason or mgr.DEFAULT_PREFILL_FAILURE_REASON)

    def _on_layouts(self, msg: List[bytes], sender: Optional[str]) -> None:
        mgr = self.mgr
        token, sig, endpoint, nonce = wire.parse_layouts(msg)
        if not mgr.auth.from_sender(msg, sender, token, "prefill"):
            return
        with self._nonces_lock:
            expected = nonce in self._nonces
        if not expected:
            mgr.auth.refuse(msg, "unexpected layouts", "it answers no registration this "
                            "decode sent", f"{endpoint[0]}:{endpoint[1]} (claimed)")
            return
        if token in self.layouts and self.layouts[token] is None:
            return  # registered again (another receiver of the same prefill rank)
        known = self.prefills.get(token)
        if known is not None and known != endpoint:
            mgr.auth.refuse(msg, "moved prefill", f"prefill {token[:8]} said it is at "
                            f"{known[0]}:{known[1]}", f"{endpoint[0]}:{endpoint[1]} (claimed)")
            return
        self.prefills[token] = endpoint
        self.layouts[token] = None if sig == mgr.signature else (
            f"the prefill's KV/aux buffers {sig} differ from this decode's {mgr.signature}")

    def _on_pull(self, msg: List[bytes], sender: Optional[str]) -> None:
        room, token, start, src, last, scopes, aux_rows = wire.parse_pull(msg)
        if not self.mgr.auth.from_sender(msg, sender, token, "prefill"):
            return
        r = self.rooms.get(room)
        if r is None:
            return  # cleared, or not ours any more
        if not self._from_room_prefill(msg, room, token, r):
            return  # changes nothing: the room's own prefill still hands it over
        h = r.handoff
        with h.lock:
            if h.complete or r.closed:
                return
            if r.token is not None and r.token != token:
                h.fact(FactKind.FAILED, "pages of one request came from two prefill ranks")
                return
            r.token = token
            try:
                pieces = r.connect(src, scopes) if self.layouts.get(token, "") is None else []
            except HandoffRefused as e:
                h.fail(str(e))
                return
            r.chunks.append((start, src, pieces))
            self.mgr.update_status(room, KVPoll.Transferring)
            if not last and r.pulled == len(r.chunks) - 1 and self.layouts.get(token, "") is None:
                # Pipelined with the prefill's next chunks: these pages are
                # final. The hand-off still completes only after the last.
                try:
                    self.pull(r, r.chunks[-1:])
                except HandoffRefused as e:
                    h.fail(str(e))
                    return
                r.pulled = len(r.chunks)
            if last:
                r.aux_rows = aux_rows
                try:
                    if self.layouts.get(token, "") is None:
                        r.connect_states(wire.pull_states(msg))
                except HandoffRefused as e:
                    h.fail(str(e))
                    return
                pages = sum(len(s) for _, s, _ in r.chunks)
                page_size = int(self.mgr.kv_args.page_size or 1)
                h.fact(FactKind.SOURCE_HELD, timing_mode=TimingMode.FULL_PROMPT,
                       full_prompt_tokens=pages * page_size,
                       kv_bytes_per_token=max(1, self.mgr.kv_item_lens_sum // page_size))

    # ---- hand-offs

    def open_room(self, room: int, dst: np.ndarray, aux_index: Optional[int],
                  targets: List[Tuple[str, int]], submit: Any,
                  state_dst: List[np.ndarray]) -> None:
        r = _DecodeRoom(self, room, dst, aux_index, targets, submit, state_dst)
        with self._rooms_lock:
            old = self.rooms.pop(room, None)
            self.rooms[room] = r
        if old is not None:
            old.handoff.close()
            old.disconnect()
        r.handoff.start()

    def close_room(self, room: int) -> None:
        with self._rooms_lock:
            r = self.rooms.pop(room, None)
        if r is not None:
            r.handoff.close()  # its pulls canceled and ended
            r.disconnect()

    def fact(self, room: int, kind: FactKind, reason: Optional[str]) -> None:
        """Steps fact kind into room's hand-off. reason: why it failed
        (recorded as the room's failure)."""
        r = self.rooms.get(room)
        if r is not None:  # else no hand-off (yet): SGLang's own status says what happened
            r.handoff.fact(kind, reason)

    def pull(self, r: _DecodeRoom, chunks: List[Tuple[int, np.ndarray, List]]) -> None:
        """Starts pulling chunks' pages from r's prefill into r's pages, with
        every worker, each piece through the instance of its metadata.
        Raises HandoffRefused (why not)."""
        why = self.layouts.get(r.token or "", "its layouts never came")
        if why is not None:
            raise HandoffRefused(f"no usable layout of prefill {(r.token or '?')[:8]}: {why}")
        for start, src, _ in chunks:
            if start < 0 or start + len(src) > len(r.dst):
                raise HandoffRefused(f"the prefill sent pages [{start}, {start + len(src)}) "
                                     f"of a request with {len(r.dst)} reserved")
        try:
            for start, src, pieces in chunks:
                for off, n, inst in pieces:
                    dst = r.dst[start + off:start + off + n]
                    for w in self.mgr.workers:
                        r.handoff.pull(w, inst, src[off:off + n], dst)
        except (KvbmError, ValueError, TypeError) as e:
            raise HandoffRefused(f"starting the pull of room {r.room}'s pages failed: "
                                 f"{e}") from e

    def pull_states(self, r: _DecodeRoom) -> None:
        """Starts pulling r's state slots from its prefill into r's, with
        each component's workers, after its pages (StartTransfer). Raises
        HandoffRefused."""
        try:
            for c, src, inst in r.states:
                for w in self.mgr.state_workers[c]:
                    r.handoff.pull(w, inst, src, r.state_dst[c])
        except (KvbmError, ValueError, TypeError) as e:
            raise HandoffRefused(f"starting the pull of room {r.room}'s state failed: "
                                 f"{e}") from e

    def done(self, r: _DecodeRoom, status: int, reason: str) -> None:
        """Tells the prefill ranks the room is done (or abandoned), from a
        pool thread: a send to a dead peer may block up to ZMQ's send
        timeout, and this runs under SGLang's poll()."""
        mgr = self.mgr
        frames = wire.done(r.room, mgr.token, status, reason)
        targets = list(r.targets)

        def send() -> None:
            for t in targets:
                try:
                    mgr._send(t, frames)
                except Exception as e:  # noqa: BLE001 - best effort: the prefill's timeout bounds it
                    logger.warning("kvbm transfer backend: telling prefill %s:%s that room "
                                   "%s is %s failed: %s", t[0], t[1], r.room,
                                   "done" if status == KVPoll.Success else "abandoned", e)
        try:
            self.pool.submit(send)
        except RuntimeError:  # closing: the pool takes nothing more
            pass

    def write_aux(self, r: _DecodeRoom) -> None:
        """Writes the prefill's aux rows into r's row of every aux buffer.
        Raises HandoffRefused (rows that do not fit)."""
        aux = self.mgr.aux
        rows = r.aux_rows or []
        if len(rows) != len(aux):
            raise HandoffRefused(f"kvbm transfer backend: the prefill sent {len(rows)} aux "
                                 f"rows, this decode has {len(aux)} aux buffers")
        i = r.aux_index
        for b, ((ptr, item, n), row) in enumerate(zip(aux, rows)):
            if len(row) != item:
                raise HandoffRefused(f"kvbm transfer backend: aux buffer {b}: the prefill's "
                                     f"row has {len(row)} bytes, this decode's {item}")
            if i is None or i < 0 or (i + 1) * item > n:
                raise HandoffRefused(f"kvbm transfer backend: aux index {i} is outside aux "
                                     f"buffer {b}")
        for (ptr, item, _), row in zip(aux, rows):
            ctypes.memmove(ptr + i * item, row, item)


class _SigningSocket:
    """SGLang's cached socket to a prefill rank, signing what it sends
    (KVBM_REG, KVBM_ROOM, ABORT) under the manager's key, for that rank's
    endpoint (to)."""

    def __init__(self, sock: Any, auth: Any, to: str) -> None:
        self._sock = sock
        self._auth = auth
        self._to = to

    def send_multipart(self, frames: List[bytes], *args: Any, **kw: Any) -> Any:
        return self._sock.send_multipart(self._auth.sign(frames, self._to), *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class KvbmKVReceiver(CommonKVReceiver):
    """Decode side of one request."""

    def _connect_to_bootstrap_server(self, bootstrap_info: dict) -> Tuple[Any, Any]:
        sock, lock = super()._connect_to_bootstrap_server(bootstrap_info)
        to = endpoint(str(bootstrap_info["rank_ip"]), int(bootstrap_info["rank_port"]))
        return _SigningSocket(sock, self.kv_mgr.auth, to), lock

    def init(self, prefill_dp_rank: int) -> None:
        super().init(prefill_dp_rank)
        if self.conclude_state == KVPoll.Failed or not hasattr(self, "prefill_info"):
            return
        mgr = self.kv_mgr
        info = self.prefill_info
        why = None
        if info.pp_size != 1 or info.attn_cp_size != 1 or mgr.pp_size != 1:
            why = f"pipeline or context parallelism (prefill pp {info.pp_size}, cp " \
                  f"{info.attn_cp_size}; decode pp {mgr.pp_size})"
        elif not mgr.is_mla_backend and info.attn_tp_size != mgr.attn_tp_size:
            why = f"different attention TP sizes for a non-MLA model (prefill " \
                  f"{info.attn_tp_size}, decode {mgr.attn_tp_size})"
        elif mgr.state_workers and info.attn_tp_size != mgr.attn_tp_size:
            # A state slot is one rank's shard: another TP would need it resliced.
            why = f"different attention TP sizes with state buffers (prefill " \
                  f"{info.attn_tp_size}, decode {mgr.attn_tp_size})"
        elif self.required_prefill_response_num != 1:
            why = f"pulling one request from {self.required_prefill_response_num} prefill ranks"
        if why is not None:
            mgr.record_failure(self.bootstrap_room, f"kvbm transfer backend: {why} is not "
                                                    f"supported")
            mgr.update_status(self.bootstrap_room, KVPoll.Failed)
            self.conclude_state = KVPoll.Failed
            # As send_metadata's refusals: the prefill fails the room now
            # (SGLang's ABORT) rather than after its bootstrap timeout.
            self.ensure_abort_notified()

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None,
                      state_indices: Optional[List] = None,
                      decode_prefix_len: Optional[int] = None,
                      destination: KVTransferDestination = KVTransferDestination.DEVICE,
                      device_kv_indices: Any = None) -> None:
        mgr = self.kv_mgr
        room = self.bootstrap_room
        if self.conclude_state == KVPoll.Failed or mgr.request_status.get(room) == KVPoll.Failed:
            return
        if destination != KVTransferDestination.DEVICE:
            raise NotImplementedError("kvbm transfer backend: host KV destinations are not "
                                      "supported")
        try:
            state_dst = pd_state.room_slots(mgr.states, state_indices)
        except ValueError as e:
            mgr.record_failure(room, str(e))
            mgr.update_status(room, KVPoll.Failed)
            self.conclude_state = KVPoll.Failed
            # SGLang's ABORT: the prefill, which has no reservation to wait
            # for, fails the room now rather than after its bootstrap timeout.
            self.ensure_abort_notified()
            return
        dst = np.ascontiguousarray(np.asarray(kv_indices, dtype=np.int32).reshape(-1))
        infos = getattr(self, "bootstrap_infos", None) or []
        targets = [(i["rank_ip"], int(i["rank_port"])) for i in infos if not i.get("is_dummy")]

        def submit() -> Tuple[bool, Optional[str]]:
            CommonKVReceiver.send_metadata(self, dst, aux_index, state_indices,
                                           decode_prefix_len, destination, device_kv_indices)
            if self.conclude_state == KVPoll.Failed or \
                    mgr.request_status.get(room) == KVPoll.Failed:
                with mgr.failure_lock:
                    why = mgr.failure_records.get(room)
                return False, why or "sending the request's metadata to the prefill failed"
            return True, None

        side: DecodeSide = mgr.side
        side.open_room(room, dst, aux_index, targets, submit, state_dst)

    def _poll(self) -> KVPoll:
        mgr = self.kv_mgr
        side: DecodeSide = mgr.side
        room = self.bootstrap_room
        if self.conclude_state is None and self.init_time is not None:
            status = mgr.request_status.get(room)
            elapsed = time.time() - self.init_time
            if status in (KVPoll.WaitingForInput, KVPoll.Transferring) and \
                    elapsed >= mgr.waiting_timeout:
                side.fact(room, FactKind.TIMED_OUT, (
                    f"Request {room} timed out after {elapsed:.1f}s in "
                    f"{'KVPoll.WaitingForInput' if status == KVPoll.WaitingForInput else 'KVPoll.Transferring'}"
                    f" (SGLANG_DISAGGREGATION_WAITING_TIMEOUT={mgr.waiting_timeout})"))
        status = super()._poll()
        if status == KVPoll.Failed:
            with mgr.failure_lock:
                why = mgr.failure_records.get(room)
            side.fact(room, FactKind.FAILED, why or "failed")
        return status

    def abort(self) -> None:
        super().abort()
        side: DecodeSide = self.kv_mgr.side
        side.fact(self.bootstrap_room, FactKind.CANCELED, "Aborted by AbortReq.")

    def clear(self) -> None:
        super().clear()
        side: DecodeSide = self.kv_mgr.side
        side.close_room(self.bootstrap_room)
