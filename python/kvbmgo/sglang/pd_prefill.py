"""The prefill side of kvbm's SGLang PD backend: it tells the decode ranks
which of its pages hold each chunk, with the kvbm metadata that reads those
pages only (block-scoped, until the waiting timeout), the last chunk with
the room's state slots and the metadata that reads those only
(``pd_state``), and lets go of a request once every decode rank pulled it
(KVBM_DONE), or gives up after SGLANG_DISAGGREGATION_WAITING_TIMEOUT from
its last chunk.

A room's metadata dies with the room: when its status becomes final
(Success or Failed: done, failed, aborted, timed out; or it is cleared) its
pages and state slots are revoked (Worker.revoke_blocks) before the status
is set, so before SGLang, which frees them once it polls that status, can
give them to another request; the revocation returns once no read it
allowed is under way."""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.common.conn import (ABORT_TAG, AbortNotification,
                                                   CommonKVManager, CommonKVSender)

from .._layout import Tier
from ..errors import KvbmError
from . import pd_state
from . import pd_wire as wire

__all__ = ["PrefillSide", "KvbmKVSender"]

logger = logging.getLogger(__name__)


#: How long a room's metadata outlasts the waiting timeout (from the chunk
#: it came with): the decode gives up within that timeout from reserving,
#: before the first chunk.
_SCOPE_MARGIN_S = 5.0


@dataclass
class _PrefillRoom:
    sent_pages: int = 0
    last_sent_at: Optional[float] = None
    done: set = field(default_factory=set)
    # Scoped metadata is exported and revoked under PrefillSide's scope
    # lock: none is made for the room once it ended (revoked).
    ended: bool = False
    scoped: List[np.ndarray] = field(default_factory=list)  # pages given out, not revoked
    # (state component, slots) given out, not revoked
    state_scoped: List[Tuple[int, np.ndarray]] = field(default_factory=list)


class PrefillSide:
    """The prefill side of a KvbmKVManager (mgr)."""

    def __init__(self, mgr: CommonKVManager) -> None:
        self.mgr = mgr  # a KvbmKVManager
        self.rooms: Dict[int, _PrefillRoom] = {}
        self._scope_lock = threading.Lock()  # rooms' scoped metadata: exports, revocations

    def _refuse(self, msg: List[bytes], reason: str, why: str, peer: str) -> None:
        self.mgr.auth.refuse(msg, reason, why, peer)

    def on_message(self, msg: List[bytes], sender: Optional[str] = None) -> None:
        """One control message; sender: the token its authentication names
        (None without a key), which must be the one the message names."""
        mgr = self.mgr
        tag = msg[0]
        if tag == wire.TAG_REG:
            ip, port, peer, sig, nonce = wire.parse_registration(msg)
            if not mgr.auth.from_sender(msg, sender, peer, "decode", f"{ip}:{port}"):
                return
            known = mgr.decode_kv_args_table.get(peer)
            if known is not None and (known["endpoint"], known["port"]) != (ip, port):
                # Metadata goes only where the decode first said it listens.
                self._refuse(msg, "moved registration", f"decode {peer[:8]} registered from "
                             f"{known['endpoint']}:{known['port']} already", f"{ip}:{port}")
                return
            mgr.decode_kv_args_table[peer] = {"endpoint": ip, "port": port, "signature": sig}
            if sig != mgr.signature:
                # The signature tells the decode why its requests fail.
                logger.error("kvbm transfer backend: decode %s:%s has KV/aux buffers %s, "
                             "this prefill %s: its requests will fail", ip, port, sig,
                             mgr.signature)
            # No capability here: each room's comes with its KVBM_PULLs.
            mgr._send((ip, port), wire.layouts(mgr.token, mgr._prefill_unique_rank(),
                                               mgr.signature, str(mgr.local_ip),
                                               int(mgr.rank_port), nonce))
        elif tag == wire.TAG_ROOM:
            info = wire.TransferInfo.parse(msg)
            room = info.room
            where = f"{info.endpoint}:{info.dst_port}"
            if not mgr.auth.from_sender(msg, sender, info.peer, "decode", where):
                return
            reg = mgr.decode_kv_args_table.get(info.peer)
            if reg is None or (reg["endpoint"], reg["port"]) != (info.endpoint, info.dst_port):
                self._refuse(msg, "unregistered decode", f"decode {info.peer[:8]} at {where} "
                             f"did not register (KVBM_REG) from there", where)
                return
            infos = mgr.transfer_infos.setdefault(room, {})
            if info.peer not in infos and len(infos) >= max(1, info.required_dst_info_num):
                self._refuse(msg, "room taken", f"room {room} has its "
                             f"{len(infos)} decode rank(s) already", where)
                return
            infos[info.peer] = info
            self.rooms.setdefault(room, _PrefillRoom())
            if len(infos) == info.required_dst_info_num:
                mgr.resolve_kv_replica_factor(infos)
                mgr.req_to_decode_prefix_len[room] = next(
                    (i.decode_prefix_len for i in infos.values() if i.decode_prefix_len), 0)
                mgr.update_status(room, KVPoll.WaitingForInput)
        elif tag == wire.TAG_DONE:
            room, peer, status, reason = wire.parse_done(msg)
            if not mgr.auth.from_sender(msg, sender, peer, "decode"):
                return
            if room not in mgr.request_status:
                return
            if peer not in mgr.transfer_infos.get(room, {}):
                self._refuse(msg, "not the room's decode", f"decode {peer[:8]} is not "
                             f"registered for room {room}", f"token {peer[:8]}")
                return
            if status != KVPoll.Success:
                mgr.record_failure(room, f"decode {peer[:8]} gave up the pull: "
                                         f"{reason or 'no reason given'}")
                mgr.update_status(room, KVPoll.Failed)
                return
            pr = self.rooms.get(room)
            if pr is None:
                return
            pr.done.add(peer)
            self._maybe_success(room)
        elif tag == ABORT_TAG:
            n = AbortNotification.from_zmq(msg)
            if n is not None and not self._abort_from_its_decode(msg, n, sender):
                return
            if n is not None and n.room in mgr.request_status and \
                    mgr.request_status[n.room] != KVPoll.Success:
                mgr.record_failure(n.room, "Aborted by decode-side abort notification.")
                mgr.update_status(n.room, KVPoll.Failed)
        else:
            logger.warning("kvbm transfer backend (prefill): unexpected message %r", tag[:20])

    def _abort_from_its_decode(self, msg: List[bytes], n: AbortNotification,
                               sender: Optional[str]) -> bool:
        """Whether SGLang's ABORT n comes from a decode of its room: with a
        key, the authenticated sender must be a registered decode (one of
        the room's, once it has some); without one, the return address it
        names must be one of the room's decodes (when it has some)."""
        mgr = self.mgr
        infos = mgr.transfer_infos.get(n.room) or {}
        if sender is not None:
            ok = sender in infos if infos else sender in mgr.decode_kv_args_table
            peer = f"token {sender[:8]}"
        else:
            ok = not infos or n.decode_ip is None or any(
                (i.endpoint, i.dst_port) == (n.decode_ip, n.decode_port)
                for i in infos.values())
            peer = f"{n.decode_ip}:{n.decode_port} (claimed)"
        if not ok:
            self._refuse(msg, "not the room's decode", f"it is not from a decode registered "
                         f"for room {n.room}", peer)
        return ok

    def _maybe_success(self, room: int) -> None:
        pr = self.rooms.get(room)
        infos = self.mgr.transfer_infos.get(room)
        if pr is None or infos is None or pr.last_sent_at is None:
            return
        real = {p for p, i in infos.items() if not i.is_dummy}
        if real <= pr.done:
            self.mgr.update_status(room, KVPoll.Success)

    def add_transfer_request(self, bootstrap_room: int, kv_indices: Any, index_slice: slice,
                             is_last_chunk: bool, aux_index: Optional[int] = None,
                             state_indices: Optional[List] = None, *,
                             wait_event: Any = None, indices_event: Any = None) -> None:
        """Tells the decode ranks which of this rank's pages hold the chunk
        (and, with the last chunk, the aux row): they pull them."""
        mgr = self.mgr
        room = bootstrap_room
        infos = mgr.transfer_infos.get(room)
        if infos is None or mgr.request_status.get(room) == KVPoll.Failed:
            return  # a dummy rank, cleared, or failed already
        slots: List[np.ndarray] = []
        if is_last_chunk:
            try:  # the room's state slots go out with its last chunk
                slots = pd_state.room_slots(mgr.states, state_indices)
            except ValueError as e:
                mgr.conclude_failure(bootstrap_room=room, failure_reason=str(e))
                return
        for ev in (wait_event, indices_event):
            if ev is not None and hasattr(ev, "synchronize"):
                ev.synchronize()  # the pages (or their indices) are written
        pages = np.ascontiguousarray(np.asarray(kv_indices, dtype=np.int32).reshape(-1))
        pr = self.rooms.setdefault(room, _PrefillRoom())
        aux_rows = None
        if is_last_chunk:
            try:
                aux_rows = self._aux_rows(aux_index)
            except ValueError as e:
                mgr.conclude_failure(bootstrap_room=room, failure_reason=str(e))
                return
        real = [i for i in infos.values() if not i.is_dummy]
        try:
            made = self._scopes(pr, pages, slots) if real else ([], [])
        except (KvbmError, ValueError) as e:
            mgr.conclude_failure(bootstrap_room=room, failure_reason=(
                f"kvbm transfer backend: the metadata of room {room}'s pages: {e}"))
            return
        if made is None:
            return  # the room ended meanwhile
        scopes, states = made
        frames = wire.pull(room, mgr.token, mgr._prefill_unique_rank(), index_slice.start,
                           pages, is_last_chunk, scopes, aux_rows, states)
        for info in real:
            try:
                mgr._send((info.endpoint, info.dst_port), frames)
            except Exception as e:  # noqa: BLE001 - a dead decode fails the request
                mgr.conclude_failure(bootstrap_room=room, failure_reason=(
                    f"kvbm transfer backend: telling decode {info.endpoint}:{info.dst_port} "
                    f"about room {room}'s pages failed: {e}"))
                return
        pr.sent_pages += len(pages)
        mgr.update_status(room, KVPoll.Transferring)
        if is_last_chunk:
            pr.last_sent_at = time.time()
            if not real:
                mgr.update_status(room, KVPoll.Success)
            else:
                self._maybe_success(room)

    def _scopes(self, pr: _PrefillRoom, pages: np.ndarray, slots: List[np.ndarray]
                ) -> Optional[Tuple[List[wire.Scope], List[pd_state.StateScope]]]:
        """The metadata that reads pages (this rank's G1 blocks) and nothing
        else, per piece (wire.scope_pieces) and worker, and each state
        component's that reads its slots only, until the waiting timeout;
        None once the room ended (its pages and slots revoked)."""
        expires = float(self.mgr.waiting_timeout) + _SCOPE_MARGIN_S
        with self._scope_lock:
            if pr.ended:
                return None
            states = []
            for c, s in enumerate(slots):
                if not len(s):
                    continue
                if len(wire.scope_pieces(s)) > 1:
                    raise ValueError(f"{len(s)} slots of state {c} in more than "
                                     f"{wire.SCOPE_RUNS} runs")
                first, *rest = self.mgr.state_workers[c]
                mds = [first.export_metadata(blocks={Tier.G1: s.tolist()}, expires=expires)]
                pr.state_scoped.append((c, s))  # given out: revoked with the room
                mds += [w.export_metadata(blocks={Tier.G1: s.tolist()}, expires=expires)
                        for w in rest]
                states.append((c, s, mds))
            out = []
            for off, n in wire.scope_pieces(pages):
                piece = pages[off:off + n]
                scope = {Tier.G1: piece.tolist()}
                first, *rest = self.mgr.workers
                mds = [first.export_metadata(blocks=scope, expires=expires)]
                pr.scoped.append(piece)  # given out: revoked with the room
                mds += [w.export_metadata(blocks=scope, expires=expires) for w in rest]
                out.append((n, mds))
            return out, states

    def revoke(self, room: int) -> None:
        """Ends the metadata of every page room's KVBM_PULLs gave out
        (Worker.revoke_blocks), once no read it allowed is under way; none is
        given out for the room afterwards. Called before the room's status
        becomes final and at its clear, before SGLang frees its pages."""
        pr = self.rooms.get(room)
        if pr is None:
            return
        # Under the scope lock to the end: an export of another room that
        # shares a page (the radix cache's prefix) waits for the revocation,
        # so its metadata is made after it and reads on.
        with self._scope_lock:
            pr.ended = True
            self._revoke_states(room, pr)
            scoped, pr.scoped = pr.scoped, []
            if not scoped:
                return
            # A page another room still gives out (a shared prefix) keeps its
            # bytes until that room ends too: revoked then.
            live = {int(b) for other in list(self.rooms.values())
                    if other is not pr and not other.ended for p in other.scoped for b in p}
            ids = sorted(set(np.unique(np.concatenate(scoped)).tolist()) - live)
            if not ids:
                return
            for w in self.mgr.workers:
                try:
                    w.revoke_blocks({Tier.G1: ids})
                except (KvbmError, ValueError) as e:  # a closed worker too
                    logger.error("kvbm transfer backend: revoking room %s's %d pages: %s",
                                 room, len(ids), e)

    def _revoke_states(self, room: int, pr: _PrefillRoom) -> None:
        """revoke's part for the state slots pr gave out (scope lock held):
        a slot another live room gives out too stays readable until it ends."""
        given, pr.state_scoped = pr.state_scoped, []
        for c in sorted({c for c, _ in given}):
            live = {int(b) for other in list(self.rooms.values())
                    if other is not pr and not other.ended
                    for oc, s in other.state_scoped if oc == c for b in s}
            ids = sorted({int(b) for gc, s in given if gc == c for b in s} - live)
            for w in self.mgr.state_workers.get(c, []) if ids else []:
                try:
                    w.revoke_blocks({Tier.G1: ids})
                except (KvbmError, ValueError) as e:  # a closed worker too
                    logger.error("kvbm transfer backend: revoking room %s's %d slots of "
                                 "state %s: %s", room, len(ids), c, e)

    def _aux_rows(self, aux_index: Optional[int]) -> List[bytes]:
        """Row aux_index of every aux buffer (host memory), copied."""
        if aux_index is None:
            raise ValueError("kvbm transfer backend: the last chunk has no aux (metadata) index")
        rows = []
        for i, (ptr, item, n) in enumerate(self.mgr.aux):
            if aux_index < 0 or (aux_index + 1) * item > n:
                raise ValueError(f"kvbm transfer backend: aux index {aux_index} is outside "
                                 f"aux buffer {i} ({n // item} rows)")
            rows.append(ctypes.string_at(ptr + aux_index * item, item))
        return rows


class KvbmKVSender(CommonKVSender):
    """Prefill side of one request."""

    def _poll_with_status(self, check_status: Any) -> KVPoll:
        status = super()._poll_with_status(check_status)
        if status == KVPoll.Transferring:
            mgr = self.kv_mgr
            side: PrefillSide = mgr.side
            pr = side.rooms.get(self.bootstrap_room)
            if pr is not None and pr.last_sent_at is not None and \
                    time.time() - pr.last_sent_at >= mgr.waiting_timeout:
                mgr.conclude_failure(bootstrap_room=self.bootstrap_room, failure_reason=(
                    f"kvbm transfer backend: the decode did not confirm the pull of room "
                    f"{self.bootstrap_room} within SGLANG_DISAGGREGATION_WAITING_TIMEOUT "
                    f"({mgr.waiting_timeout}s)"))
                return super()._poll_with_status(check_status)
        return status

    def clear(self) -> None:
        side: PrefillSide = self.kv_mgr.side
        side.revoke(self.bootstrap_room)  # before SGLang frees the pages
        super().clear()
        side.rooms.pop(self.bootstrap_room, None)

    def abort(self) -> None:
        mgr = self.kv_mgr
        targets = mgr._room_notify_targets(self.bootstrap_room)
        super().abort()
        mgr.send_kv_status_message(targets=targets, bootstrap_room=self.bootstrap_room,
                                   status=KVPoll.Failed,
                                   failure_reason="Aborted by the prefill (AbortReq).")
