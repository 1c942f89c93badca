"""The prefill side of kvbm's SGLang PD backend: it tells the decode ranks
which of its pages hold each chunk, and lets go of a request once every
decode rank pulled it (KVBM_DONE), or gives up after
SGLANG_DISAGGREGATION_WAITING_TIMEOUT from its last chunk."""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.common.conn import (ABORT_TAG, AbortNotification,
                                                   CommonKVManager, CommonKVSender)

from . import pd_wire as wire

__all__ = ["PrefillSide", "KvbmKVSender"]

logger = logging.getLogger(__name__)


@dataclass
class _PrefillRoom:
    sent_pages: int = 0
    last_sent_at: Optional[float] = None
    done: set = field(default_factory=set)


class PrefillSide:
    """The prefill side of a KvbmKVManager (mgr)."""

    def __init__(self, mgr: CommonKVManager) -> None:
        self.mgr = mgr  # a KvbmKVManager
        self.rooms: Dict[int, _PrefillRoom] = {}

    def on_message(self, msg: List[bytes]) -> None:
        mgr = self.mgr
        tag = msg[0]
        if tag == wire.TAG_REG:
            ip, port, peer, sig = wire.parse_registration(msg)
            mgr.decode_kv_args_table[peer] = {"endpoint": ip, "port": port, "signature": sig}
            if sig != mgr.signature:
                logger.error("kvbm transfer backend: decode %s:%s has KV/aux buffers %s, "
                             "this prefill %s: its requests will fail", ip, port, sig,
                             mgr.signature)
            mgr._send((ip, port), wire.layouts(mgr.token, mgr._prefill_unique_rank(),
                                               mgr.signature,
                                               [w.export_metadata(read_only=True) for w in mgr.workers]))
        elif tag == wire.TAG_ROOM:
            info = wire.TransferInfo.parse(msg)
            room = info.room
            infos = mgr.transfer_infos.setdefault(room, {})
            infos[info.peer] = info
            self.rooms.setdefault(room, _PrefillRoom())
            if len(infos) == info.required_dst_info_num:
                mgr.resolve_kv_replica_factor(infos)
                mgr.req_to_decode_prefix_len[room] = next(
                    (i.decode_prefix_len for i in infos.values() if i.decode_prefix_len), 0)
                mgr.update_status(room, KVPoll.WaitingForInput)
        elif tag == wire.TAG_DONE:
            room, peer, status, reason = wire.parse_done(msg)
            if room not in mgr.request_status:
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
            if n is not None and n.room in mgr.request_status and \
                    mgr.request_status[n.room] != KVPoll.Success:
                mgr.record_failure(n.room, "Aborted by decode-side abort notification.")
                mgr.update_status(n.room, KVPoll.Failed)
        else:
            logger.warning("kvbm transfer backend (prefill): unexpected message %r", tag[:20])

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
        if state_indices and any(s is not None and len(s) > 0 for s in state_indices):
            mgr.conclude_failure(bootstrap_room=room, failure_reason=(
                "kvbm transfer backend: extra state (Mamba/SWA/DSA/...) transfer is not "
                "supported"))
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
        frames = wire.pull(room, mgr.token, mgr._prefill_unique_rank(), index_slice.start,
                           pages, is_last_chunk, aux_rows)
        real = [i for i in infos.values() if not i.is_dummy]
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
        super().clear()
        side: PrefillSide = self.kv_mgr.side
        side.rooms.pop(self.bootstrap_room, None)

    def abort(self) -> None:
        mgr = self.kv_mgr
        targets = mgr._room_notify_targets(self.bootstrap_room)
        super().abort()
        mgr.send_kv_status_message(targets=targets, bootstrap_room=self.bootstrap_room,
                                   status=KVPoll.Failed,
                                   failure_reason="Aborted by the prefill (AbortReq).")
