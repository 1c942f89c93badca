"""SGLang's PD-disaggregation transfer backend "kvbm": the decode side pulls
the prefill's KV pages through kvbm's remote transfer.

Built on SGLang's ``CommonKVManager``/``CommonKVSender``/``CommonKVReceiver``
/``CommonKVBootstrapServer`` as the built-in backends are: the bootstrap
server, the prefill's registration with it, the decode's ``/route`` queries,
``prefill_info_table``/``try_ensure_parallel_info``, the status table, the
heartbeat and the timeouts (``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT``,
``..._WAITING_TIMEOUT``, ``..._HEARTBEAT_INTERVAL``,
``..._HEARTBEAT_MAX_FAILURE``) are SGLang's own. What differs is who moves
the bytes: kvbm's decode worker pulls them (``transfer_from_instance``) from
the prefill worker's registered KV memory.

Memory: each side registers SGLang's KV buffers (``KVArgs.kv_data_ptrs``, the
raw per-layer K and V buffers; ``kv_item_lens`` is one page of one layer) as
its kvbm worker's G1, without copies: one worker per group of buffers of one
shape (usually one group: every K and V layer), a buffer being a "layer" of
``num_pages`` blocks of ``item_len`` bytes. The aux (metadata) row of a
request, ``KVArgs.aux_data_ptrs`` (SGLang's ``MetadataBuffers``, host memory:
first output token, logprobs, bootstrap room, ...), travels in the message
that hands the last pages over, and is written on the decode side after the
pages arrived (libkvbm cannot register caller-owned host memory under its
cuda backend).

Control messages (ZMQ, on the managers' own sockets)::

    decode -> prefill  KVBM_REG   once per prefill rank: who the decode is
    prefill -> decode  KVBM_META  reply: the prefill workers' kvbm metadata
    decode -> prefill  KVBM_ROOM  per request: the decode reserved its pages
    prefill -> decode  KVBM_PULL  per sent chunk: source pages (+ aux row, last)
    decode -> prefill  KVBM_DONE  the decode owns the KV (or gave up): release
    prefill -> decode  KVBM_STATUS  the prefill failed the request (reason)

Each request's hand-off is sequenced on the decode side by kvbm's hand-off
coordinator in SGLang's order (destination first): ReserveDestination (the
decode reserved pages), SubmitPrefill (KVBM_ROOM sent), SourceHeld (the last
KVBM_PULL came), StartTransfer (the pull of what is left: the pages of
earlier chunks are pulled as they come, overlapping the prefill's next
chunks), TransferCompleted (every pull of the request done),
ActivateDestination (aux row written, Success), ReleaseSource (KVBM_DONE);
a failure, timeout or abort runs CancelSource (KVBM_DONE with the reason)
and CancelDestination (Failed).

Bounds: decode, SGLANG_DISAGGREGATION_WAITING_TIMEOUT from send_metadata to
Success (through WaitingForInput and Transferring; kvbm's remote deadline of
each worker is that timeout, at most 30 s), and the heartbeat to the
prefill's bootstrap server (a dead prefill: Failed after
HEARTBEAT_INTERVAL x HEARTBEAT_MAX_FAILURE); prefill,
SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT in Bootstrapping, and
SGLANG_DISAGGREGATION_WAITING_TIMEOUT from its last chunk until the decode
confirms the pull.

Supported: MHA and MLA pools (and a draft pool beside them), equal attention
TP, PP 1, CP 1, no extra state pools (Mamba, SWA, DSA, ...); the rest ends in
Failed with the reason (an MLA model with a larger prefill TP goes through
SGLang's dummy ranks: not tested). Refused when the manager is made: the
decode allocation policy "prefill_complete", and metadata buffers in device
memory (SGLANG_MOONCAKE_CUSTOM_MEM_POOL=INTRA_NODE_NVLINK).
"""

from __future__ import annotations

import ctypes
import itertools
import json
import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import zmq

from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll, KVTransferDestination
from sglang.srt.disaggregation.common.conn import (
    ABORT_TAG,
    AbortNotification,
    CommonKVBootstrapServer,
    CommonKVManager,
    CommonKVReceiver,
    CommonKVSender,
)
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.environ import envs
from sglang.srt.utils.network import NetworkAddress

from .._handoff import (Action, ActionKind, FactKind, HandoffCoordinator, HandoffOrder,
                        OutcomeKind, TimingMode)
from .._info import backend
from .._layout import LayoutConfig, Tier
from .._memory import Buffer
from .._worker import Worker
from ..errors import KvbmError

__all__ = ["KvbmKVManager", "KvbmKVSender", "KvbmKVReceiver", "KvbmKVBootstrapServer",
           "kv_groups"]

logger = logging.getLogger(__name__)

TAG_REG = b"KVBM_REG"
TAG_META = b"KVBM_META"
TAG_ROOM = b"KVBM_ROOM"
TAG_PULL = b"KVBM_PULL"
TAG_DONE = b"KVBM_DONE"

_worker_ids = itertools.count(1)


def _next_worker_id() -> int:
    # Distinct from the HiCache backend's ids (pid << 24 | n) in one process.
    return (0x5D << 56) | ((os.getpid() & 0xFFFFFFFF) << 20) | next(_worker_ids)


def _a(x: Any) -> bytes:
    return str(x).encode("ascii")


@dataclass(frozen=True)
class KVGroup:
    """KV buffers of one shape, registered as one kvbm worker's G1: each
    buffer is a "layer" of num_pages blocks of item_len bytes."""
    buffers: Tuple[int, ...]  # indices into kv_data_ptrs
    num_pages: int
    item_len: int

    def layout(self) -> LayoutConfig:
        return LayoutConfig(num_blocks=self.num_pages, num_layers=len(self.buffers),
                            outer_dim=1, page_size=1, inner_dim=self.item_len, dtype_width=1,
                            layout="layer_separate", block_dim="first")


def kv_groups(lens: Sequence[int], item_lens: Sequence[int]) -> List[KVGroup]:
    """KVArgs' buffers grouped by (pages, page bytes), in buffer order.
    Raises ValueError for a buffer smaller than a page or a bad length."""
    if len(lens) != len(item_lens) or not lens:
        raise ValueError(f"kvbm transfer backend: {len(lens)} KV buffer lengths, "
                         f"{len(item_lens)} item lengths (need as many, at least one)")
    by_shape: Dict[Tuple[int, int], List[int]] = {}
    for i, (n, item) in enumerate(zip(lens, item_lens)):
        n, item = int(n), int(item)
        if item <= 0 or n < item:
            raise ValueError(f"kvbm transfer backend: KV buffer {i} has {n} bytes, "
                             f"its page {item}")
        by_shape.setdefault((n // item, item), []).append(i)
    return [KVGroup(tuple(ix), pages, item) for (pages, item), ix in by_shape.items()]


def _signature(groups: Sequence[KVGroup], aux_item_lens: Sequence[int]) -> str:
    """What both sides must agree on (page counts may differ)."""
    return json.dumps({"kv": [[list(g.buffers), g.item_len] for g in groups],
                       "aux": [int(x) for x in aux_item_lens]})


@dataclass
class _TransferInfo:
    """One decode rank's reservation for a room, as the prefill keeps it
    (the fields SGLang's common code reads: is_dummy, endpoint, dst_port,
    required_dst_info_num)."""
    room: int
    endpoint: str
    dst_port: int
    peer: str
    num_pages: int
    required_dst_info_num: int
    decode_prefix_len: int
    is_dummy: bool


@dataclass
class _PrefillRoom:
    sent_pages: int = 0
    last_sent_at: Optional[float] = None
    done: set = field(default_factory=set)


class _DecodeRoom:
    """One request's hand-off on the decode side."""

    def __init__(self, room: int, dst: np.ndarray, aux_index: Optional[int],
                 targets: List[Tuple[str, int]], started: float) -> None:
        self.lock = threading.RLock()
        self.room = room
        self.dst = dst
        self.aux_index = aux_index
        self.targets = targets
        self.started = started
        self.chunks: List[Tuple[int, np.ndarray]] = []  # (dst offset, source pages)
        self.pulled = 0  # chunks whose pull started before the last came
        self.early: List[Any] = []  # their notifications
        self.token: Optional[str] = None
        self.aux_rows: Optional[List[bytes]] = None
        self.submit: Any = None
        self.submitted = False
        self.reason: Optional[str] = None
        self.bytes = 0
        self.coord = HandoffCoordinator(uuid.uuid4(), HandoffOrder.DESTINATION_FIRST)


class KvbmKVManager(CommonKVManager):
    """One rank's kvbm transfer manager (prefill or decode)."""

    kv_status_msg_tag = b"KVBM_STATUS"
    kv_status_msg_carries_reason = True
    reports_transfer_latency = True

    def __init__(self, args: KVArgs, disaggregation_mode: DisaggregationMode,
                 server_args: Any, is_mla_backend: Optional[bool] = False) -> None:
        self.token = uuid.uuid4().hex  # this manager's name on the wire
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self.workers: List[Worker] = []
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        if self.defer_decode_allocation:
            self.server_socket.close(linger=0)
            raise ValueError("kvbm transfer backend: --disaggregation-decode-allocation-policy "
                             "prefill_complete is not supported (use early, the default)")
        if envs.SGLANG_MOONCAKE_CUSTOM_MEM_POOL.get() == "INTRA_NODE_NVLINK":
            self.server_socket.close(linger=0)
            raise ValueError("kvbm transfer backend: the metadata buffers must be host memory "
                             "(unset SGLANG_MOONCAKE_CUSTOM_MEM_POOL=INTRA_NODE_NVLINK)")
        if any(getattr(args, "state_data_ptrs", None) or []):
            logger.warning("kvbm transfer backend: the extra state pools (%s) are not "
                           "transferred; a request that carries state indices fails",
                           getattr(args, "state_types", None))
        if disaggregation_mode == DisaggregationMode.PREFILL:
            # How long the prefill holds a request's pages for the decode's
            # pull after its last chunk (SGLang's decode-side setting).
            self.waiting_timeout = envs.SGLANG_DISAGGREGATION_WAITING_TIMEOUT.get()
        self.groups = kv_groups(args.kv_data_lens, args.kv_item_lens)
        self.aux = [(int(p), int(item), int(n)) for p, item, n in
                    zip(args.aux_data_ptrs, args.aux_item_lens, args.aux_data_lens)]
        self.signature = _signature(self.groups, [a[1] for a in self.aux])
        self._register(args)
        if disaggregation_mode == DisaggregationMode.PREFILL:
            self._prefill_rooms: Dict[int, _PrefillRoom] = {}
            self._spawn(lambda: self._message_loop(self._prefill_message), "kvbm-prefill")
        else:
            self._instances: Dict[str, Any] = {}  # prefill token -> instance id or why not
            self._next_instance = itertools.count(1)
            self._rooms: Dict[int, _DecodeRoom] = {}
            self._rooms_lock = threading.Lock()
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kvbm-pull")
            self._spawn(lambda: self._message_loop(self._decode_message), "kvbm-decode")
            self._heartbeat = self._start_heartbeat_checker_thread()

    # ---- setup and teardown

    def _register(self, args: KVArgs) -> None:
        """Registers SGLang's KV buffers, unchanged, as G1 of one worker per group."""
        cuda = backend() == "cuda"
        gpu = int(getattr(args, "gpu_id", 0) or 0)
        try:
            for g in self.groups:
                # Each operation on the peer's memory ends within the
                # request's own bound (kvbm's default is 30 s): a pull that
                # outlives the waiting timeout would write pages SGLang has
                # taken back.
                w = Worker(_next_worker_id(), device_id=gpu if cuda else 0,
                           rank=int(getattr(args, "engine_rank", 0) or 0),
                           remote_deadline=min(30.0, max(1.0, float(self.waiting_timeout))))
                self.workers.append(w)
                cfg = g.layout()
                w.register_g1(cfg, [Buffer(int(args.kv_data_ptrs[i]), cfg.layer_bytes, 1,
                                           gpu if cuda else None, None) for i in g.buffers])
        except BaseException:
            self.close()
            raise
        logger.info("kvbm transfer backend (%s): %d KV buffers in %d group(s) %s, %d aux "
                    "buffers", self.disaggregation_mode.value, len(args.kv_data_ptrs),
                    len(self.groups),
                    [(len(g.buffers), g.num_pages, g.item_len) for g in self.groups],
                    len(self.aux))

    def _message_loop(self, handle: Any) -> None:
        """Hands every message received to handle until the socket closes."""
        while True:
            msg = self._recv()
            if msg is None:
                return
            try:
                handle(msg)
            except Exception:  # noqa: BLE001 - one bad message must not stop the loop
                logger.exception("kvbm transfer backend: dropping a malformed message %r",
                                 msg[:1])

    def _spawn(self, target: Any, name: str) -> None:
        def guarded() -> None:
            try:
                target()
            except Exception:  # noqa: BLE001 - say so: the requests will time out
                logger.exception("kvbm transfer backend: %s died; its requests end in "
                                 "Failed by their timeouts", name)
        t = threading.Thread(target=guarded, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _recv(self) -> Optional[List[bytes]]:
        """The next control message, or None when stopping."""
        while not self._stop.is_set():
            try:
                if self.server_socket.poll(100):
                    return self.server_socket.recv_multipart()
            except zmq.ZMQError:
                if self._stop.is_set():
                    return None
                raise
        return None

    def close(self) -> None:
        """Stops the threads and closes the workers (the KV memory stays SGLang's)."""
        self._stop.set()
        hb = getattr(self, "_heartbeat_shutdown", None)
        if hb is not None:
            hb.set()
        for t in self._threads:
            t.join(timeout=5)
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=True)
        for r in list(getattr(self, "_rooms", {}).values()):
            r.coord.close()
            for n in r.early:  # pulls not yet awaited (they go on)
                n.close()
            r.early = []
        for w in self.workers:
            try:
                w.close()
            except KvbmError as e:
                logger.warning("kvbm transfer backend: closing a worker: %s", e)
        self.workers = []
        sock = getattr(self, "server_socket", None)
        if sock is not None:
            sock.close(linger=0)
        with self._socket_lock:
            for s in list(self._socket_cache.values()) + list(self._monitor_cache.values()):
                s.close(linger=0)
            self._socket_cache.clear()
            self._monitor_cache.clear()

    teardown = close

    def _send(self, endpoint: Tuple[str, int], frames: List[bytes]) -> None:
        na = NetworkAddress(endpoint[0], int(endpoint[1]))
        tcp = na.to_tcp()
        # SGLang's cached PUSH socket does not reconnect, and waits up to its
        # send timeout (30 s) for a peer: to a peer that died a moment ago,
        # before its disconnection reached the socket's monitor, a send
        # blocks that long. Bounded here by a few seconds (or the waiting
        # timeout, past which the prefill gives up on the decode anyway,
        # when shorter); a socket that timed out is dropped, as SGLang drops
        # one its monitor saw disconnect, so that the next message (the
        # failure SGLang reports) does not wait again.
        sock = self._connect(tcp, is_ipv6=na.is_ipv6)
        with self._socket_send_locks[tcp]:
            if self._socket_cache.get(tcp) is not sock:
                # Dropped or replaced (by another thread's timeout, SGLang's
                # reconnect or close()) since: the current one, or a new one.
                sock = self._connect(tcp, is_ipv6=na.is_ipv6)
            sock.setsockopt(zmq.SNDTIMEO, self._send_timeout_ms())
            try:
                sock.send_multipart(frames)
            except zmq.Again:
                self._drop_socket(tcp, sock)
                raise

    def _drop_socket(self, endpoint: str, sock: Any) -> None:
        with self._socket_lock:
            if self._socket_cache.get(endpoint) is not sock:
                return  # replaced already
            del self._socket_cache[endpoint]
            sock.close(linger=0)
            monitor = self._monitor_cache.pop(endpoint, None)
            if monitor is not None:
                monitor.close()

    def _send_timeout_ms(self) -> int:
        # A live peer takes a message at once (a PUSH socket blocks only with
        # 1,000 queued): a few seconds is long enough for one, and the
        # waiting timeout (300 s by default) far too long for the scheduler
        # thread this runs on.
        timeout = float(getattr(self, "waiting_timeout", 5) or 5)
        return int(min(5.0, max(1.0, timeout)) * 1000)

    # ---- messages the common receiver sends (decode -> prefill)

    def build_receiver_registration_message(self) -> List[bytes]:
        return [TAG_REG, self.local_ip.encode("ascii"), _a(self.rank_port),
                self.token.encode("ascii"), self.signature.encode()]

    def build_receiver_metadata_message(self, *, bootstrap_room: int, required_dst_info_num: int,
                                        kv_indices: Any, aux_index: Optional[int],
                                        state_indices: Optional[List],
                                        decode_prefix_len: Optional[int], is_dummy: bool,
                                        device_kv_indices: Any = None) -> List[bytes]:
        return [TAG_ROOM, _a(bootstrap_room), self.local_ip.encode("ascii"),
                _a(self.rank_port), self.token.encode("ascii"),
                _a(0 if is_dummy else len(kv_indices)), _a(required_dst_info_num),
                _a(decode_prefix_len or 0), _a(int(is_dummy))]

    # ---- prefill side

    def _prefill_message(self, msg: List[bytes]) -> None:
        tag = msg[0]
        if tag == TAG_REG:
            ip, port, peer, sig = (msg[1].decode(), int(msg[2]), msg[3].decode(),
                                   msg[4].decode())
            self.decode_kv_args_table[peer] = {"endpoint": ip, "port": port,
                                               "signature": sig}
            if sig != self.signature:
                logger.error("kvbm transfer backend: decode %s:%s has KV/aux buffers %s, "
                             "this prefill %s: its requests will fail", ip, port, sig,
                             self.signature)
            frames = [TAG_META, self.token.encode("ascii"), _a(self._prefill_unique_rank()),
                      self.signature.encode()]
            frames += [w.export_metadata() for w in self.workers]
            self._send((ip, port), frames)
        elif tag == TAG_ROOM:
            info = _TransferInfo(room=int(msg[1]), endpoint=msg[2].decode(),
                                 dst_port=int(msg[3]), peer=msg[4].decode(),
                                 num_pages=int(msg[5]), required_dst_info_num=int(msg[6]),
                                 decode_prefix_len=int(msg[7]), is_dummy=bool(int(msg[8])))
            room = info.room
            infos = self.transfer_infos.setdefault(room, {})
            infos[info.peer] = info
            self._prefill_rooms.setdefault(room, _PrefillRoom())
            if len(infos) == info.required_dst_info_num:
                self.resolve_kv_replica_factor(infos)
                self.req_to_decode_prefix_len[room] = next(
                    (i.decode_prefix_len for i in infos.values() if i.decode_prefix_len), 0)
                self.update_status(room, KVPoll.WaitingForInput)
        elif tag == TAG_DONE:
            room, peer, status = int(msg[1]), msg[2].decode(), int(msg[3])
            reason = msg[4].decode("utf-8", "replace") if len(msg) > 4 else ""
            if room not in self.request_status:
                return
            if status != KVPoll.Success:
                self.record_failure(room, f"decode {peer[:8]} gave up the pull: "
                                          f"{reason or 'no reason given'}")
                self.update_status(room, KVPoll.Failed)
                return
            pr = self._prefill_rooms.get(room)
            if pr is None:
                return
            pr.done.add(peer)
            self._maybe_prefill_success(room)
        elif tag == ABORT_TAG:
            n = AbortNotification.from_zmq(msg)
            if n is not None and n.room in self.request_status and \
                    self.request_status[n.room] != KVPoll.Success:
                self.record_failure(n.room, "Aborted by decode-side abort notification.")
                self.update_status(n.room, KVPoll.Failed)
        else:
            logger.warning("kvbm transfer backend (prefill): unexpected message %r", tag[:20])

    def _maybe_prefill_success(self, room: int) -> None:
        pr = self._prefill_rooms.get(room)
        infos = self.transfer_infos.get(room)
        if pr is None or infos is None or pr.last_sent_at is None:
            return
        real = {p for p, i in infos.items() if not i.is_dummy}
        if real <= pr.done:
            self.update_status(room, KVPoll.Success)

    def add_transfer_request(self, bootstrap_room: int, kv_indices: Any, index_slice: slice,
                             is_last_chunk: bool, aux_index: Optional[int] = None,
                             state_indices: Optional[List] = None,
                             num_kv_tokens: Optional[int] = None, *, wait_event: Any = None,
                             indices_event: Any = None, trace_ctx: Any = None) -> None:
        """Tells the decode ranks which of this rank's pages hold the chunk
        (and, with the last chunk, the aux row): they pull them."""
        room = bootstrap_room
        infos = self.transfer_infos.get(room)
        if infos is None or self.request_status.get(room) == KVPoll.Failed:
            return  # a dummy rank, cleared, or failed already
        if state_indices and any(s is not None and len(s) > 0 for s in state_indices):
            self.conclude_failure(bootstrap_room=room, failure_reason=(
                "kvbm transfer backend: extra state (Mamba/SWA/DSA/...) transfer is not "
                "supported"))
            return
        for ev in (wait_event, indices_event):
            if ev is not None and hasattr(ev, "synchronize"):
                ev.synchronize()  # the pages (or their indices) are written
        pages = np.ascontiguousarray(np.asarray(kv_indices, dtype=np.int32).reshape(-1))
        pr = self._prefill_rooms.setdefault(room, _PrefillRoom())
        frames = [TAG_PULL, _a(room), self.token.encode("ascii"),
                  _a(self._prefill_unique_rank()), _a(index_slice.start), pages.tobytes(),
                  b"1" if is_last_chunk else b"0"]
        if is_last_chunk:
            try:
                frames += self._aux_rows(aux_index)
            except ValueError as e:
                self.conclude_failure(bootstrap_room=room, failure_reason=str(e))
                return
        real = [i for i in infos.values() if not i.is_dummy]
        for info in real:
            try:
                self._send((info.endpoint, info.dst_port), frames)
            except Exception as e:  # noqa: BLE001 - a dead decode fails the request
                self.conclude_failure(bootstrap_room=room, failure_reason=(
                    f"kvbm transfer backend: telling decode {info.endpoint}:{info.dst_port} "
                    f"about room {room}'s pages failed: {e}"))
                return
        pr.sent_pages += len(pages)
        self.update_status(room, KVPoll.Transferring)
        if is_last_chunk:
            pr.last_sent_at = time.time()
            if not real:
                self.update_status(room, KVPoll.Success)
            else:
                self._maybe_prefill_success(room)

    def _aux_rows(self, aux_index: Optional[int]) -> List[bytes]:
        """Row aux_index of every aux buffer (host memory), copied."""
        if aux_index is None:
            raise ValueError("kvbm transfer backend: the last chunk has no aux (metadata) index")
        rows = []
        for i, (ptr, item, n) in enumerate(self.aux):
            if aux_index < 0 or (aux_index + 1) * item > n:
                raise ValueError(f"kvbm transfer backend: aux index {aux_index} is outside "
                                 f"aux buffer {i} ({n // item} rows)")
            rows.append(ctypes.string_at(ptr + aux_index * item, item))
        return rows

    # ---- decode side

    def _decode_message(self, msg: List[bytes]) -> None:
        tag = msg[0]
        if tag == TAG_META:
            self._on_meta(msg)
        elif tag == TAG_PULL:
            self._on_pull(msg)
        elif self.handle_abort_ack_message(msg):
            pass
        else:
            parsed = self.parse_kv_status_message(msg)
            if parsed is None:
                logger.warning("kvbm transfer backend (decode): unexpected message %r",
                               tag[:20])
                return
            room, status, prefill_rank, reason = parsed
            self.apply_prefill_status(bootstrap_room=room, status=status,
                                      prefill_rank=prefill_rank, failure_reason=reason)
            if status == KVPoll.Failed:
                self._fact(room, FactKind.FAILED, reason or self.DEFAULT_PREFILL_FAILURE_REASON)

    def _on_meta(self, msg: List[bytes]) -> None:
        token, sig, mds = msg[1].decode(), msg[3].decode(), msg[4:]
        if isinstance(self._instances.get(token), int):
            return  # registered again (another receiver of the same prefill rank)
        if sig != self.signature:
            self._instances[token] = (f"the prefill's KV/aux buffers {sig} differ from this "
                                      f"decode's {self.signature}")
            return
        if len(mds) != len(self.workers):
            self._instances[token] = f"the prefill sent {len(mds)} layouts, expected " \
                                     f"{len(self.workers)}"
            return
        instance = next(self._next_instance)
        try:
            for w, md in zip(self.workers, mds):
                w.connect_remote(instance, md)
        except KvbmError as e:
            self._instances[token] = f"importing the prefill's kvbm metadata failed: {e}"
            return
        self._instances[token] = instance

    def _on_pull(self, msg: List[bytes]) -> None:
        room, token, start = int(msg[1]), msg[2].decode(), int(msg[4])
        src = np.frombuffer(msg[5], dtype=np.int32)
        last = msg[6] == b"1"
        r = self._rooms.get(room)
        if r is None:
            return  # cleared, or not ours any more
        with r.lock:
            if r.coord.is_complete():
                return
            if r.token is not None and r.token != token:
                self._fact(room, FactKind.FAILED, "pages of one request came from two prefill "
                                                  "ranks")
                return
            r.token = token
            r.chunks.append((start, src))
            self.update_status(room, KVPoll.Transferring)
            if not last and r.pulled == len(r.chunks) - 1 and \
                    isinstance(self._instances.get(token), int):
                # Pipelined with the prefill's next chunks: these pages are
                # final. The hand-off still completes only after the last.
                notes, why = self._pull(r, r.chunks[-1:])
                if why is not None:
                    self._fact(room, FactKind.FAILED, why)
                    return
                r.early += notes
                r.pulled = len(r.chunks)
            if last:
                r.aux_rows = list(msg[7:])
                pages = sum(len(s) for _, s in r.chunks)
                self._fact(room, FactKind.SOURCE_HELD, None, timing_mode=TimingMode.FULL_PROMPT,
                           full_prompt_tokens=pages * int(self.kv_args.page_size or 1),
                           kv_bytes_per_token=max(1, self.kv_item_lens_sum //
                                                  int(self.kv_args.page_size or 1)))

    def _open_room(self, room: int, dst: np.ndarray, aux_index: Optional[int],
                   targets: List[Tuple[str, int]], submit: Any) -> _DecodeRoom:
        r = _DecodeRoom(room, dst, aux_index, targets, time.time())
        r.submit = submit
        with self._rooms_lock:
            old = self._rooms.pop(room, None)
            self._rooms[room] = r
        if old is not None:
            old.coord.close()
        with r.lock:
            self._drive(r, r.coord.start())
        return r

    def _close_room(self, room: int) -> None:
        with self._rooms_lock:
            r = self._rooms.pop(room, None)
        if r is not None:
            with r.lock:
                r.coord.close()
                for n in r.early:  # pulls a failure left unawaited (they go on)
                    n.close()
                r.early = []

    def _fact(self, room: int, kind: FactKind, reason: Optional[str], **timing: Any) -> None:
        """Steps fact kind into room's coordinator and runs what comes out.
        reason: why it failed (recorded as the room's failure)."""
        r = self._rooms.get(room)
        if r is None:
            return  # no hand-off (yet): SGLang's own status says what happened
        with r.lock:
            if r.coord.closed or r.coord.is_complete():
                return
            if reason is not None and r.reason is None:
                r.reason = reason
            try:
                acts = r.coord.on_fact(kind, **timing)
            except KvbmError as e:
                if kind == FactKind.FAILED:
                    logger.error("kvbm transfer backend: room %s: %s", room, e)
                    self._cancel_destination(r)
                    return
                r.reason = r.reason or f"hand-off out of order ({kind.name}: {e})"
                acts = r.coord.on_fact(FactKind.FAILED)
            self._drive(r, acts)

    def _drive(self, r: _DecodeRoom, actions: List[Action]) -> None:
        """Executes the coordinator's actions (r.lock held), feeding back outcomes."""
        for a in actions:
            if a.kind == ActionKind.COMPLETE:
                logger.debug("kvbm transfer backend: room %s: hand-off %s", r.room,
                             a.completion.name)
                continue
            outcome, message, then = self._execute(r, a)
            self._drive(r, r.coord.on_outcome(a.id, outcome, message))
            if then is not None and not r.coord.is_complete():
                self._drive(r, r.coord.on_fact(then))

    def _execute(self, r: _DecodeRoom, a: Action
                 ) -> Tuple[OutcomeKind, Optional[str], Optional[FactKind]]:
        """Does action a; returns (outcome, why it failed, a fact that follows)."""
        k = a.kind
        if k == ActionKind.RESERVE_DESTINATION:
            # SGLang reserved the pages before send_metadata.
            return OutcomeKind.ACCEPTED, None, FactKind.DESTINATION_RESERVED
        if k == ActionKind.SUBMIT_PREFILL:
            ok, why = r.submit()
            r.submitted = ok
            if not ok:
                r.reason = r.reason or why
                return OutcomeKind.FAILED, why, None
            return OutcomeKind.SUBMITTED, None, None
        if k == ActionKind.START_TRANSFER:
            return self._start_transfer(r)
        if k == ActionKind.ACTIVATE_DESTINATION:
            why = self._write_aux(r)
            if why is not None:
                r.reason = r.reason or why
                return OutcomeKind.FAILED, why, None
            self.update_status(r.room, KVPoll.Success)
            return OutcomeKind.APPLIED, None, None
        if k == ActionKind.RELEASE_SOURCE:
            self._done(r, KVPoll.Success, "")
            return OutcomeKind.APPLIED, None, None
        if k == ActionKind.CANCEL_SOURCE:
            if r.submitted:
                self._done(r, KVPoll.Failed, r.reason or "decode gave up")
                return OutcomeKind.APPLIED, None, None
            return OutcomeKind.NOOP, None, None
        if k == ActionKind.CANCEL_DESTINATION:
            self._cancel_destination(r)
            return OutcomeKind.APPLIED, None, None
        raise AssertionError(f"unexpected hand-off action {a}")

    def _cancel_destination(self, r: _DecodeRoom) -> None:
        if r.room in self.request_status:
            self.record_failure(r.room, r.reason or "kvbm transfer failed")
            self.update_status(r.room, KVPoll.Failed)

    def _done(self, r: _DecodeRoom, status: int, reason: str) -> None:
        """Tells the prefill ranks the room is done (or abandoned), from a
        pool thread: a send to a dead peer may block up to ZMQ's send
        timeout, and this runs under SGLang's poll()."""
        frames = [TAG_DONE, _a(r.room), self.token.encode("ascii"), _a(int(status)),
                  reason.encode("utf-8")]
        targets = list(r.targets)

        def send() -> None:
            for t in targets:
                try:
                    self._send(t, frames)
                except Exception as e:  # noqa: BLE001 - best effort: the prefill's timeout bounds it
                    logger.warning("kvbm transfer backend: telling prefill %s:%s that room "
                                   "%s is %s failed: %s", t[0], t[1], r.room,
                                   "done" if status == KVPoll.Success else "abandoned", e)
        try:
            self._pool.submit(send)
        except RuntimeError:  # closing: the pool takes nothing more
            pass

    def _start_transfer(self, r: _DecodeRoom
                        ) -> Tuple[OutcomeKind, Optional[str], Optional[FactKind]]:
        def failed(why: str) -> Tuple[OutcomeKind, Optional[str], Optional[FactKind]]:
            r.reason = r.reason or why
            return OutcomeKind.FAILED, why, None

        notes, why = self._pull(r, r.chunks[r.pulled:])
        if why is not None:
            return failed(why)
        notes, r.early = r.early + notes, []
        if not notes:
            return OutcomeKind.SCHEDULED, None, FactKind.TRANSFER_COMPLETED
        deadline = r.started + self.waiting_timeout
        self._pool.submit(self._await, r.room, r, notes, deadline)
        return OutcomeKind.SCHEDULED, None, None

    def _pull(self, r: _DecodeRoom, chunks: List[Tuple[int, np.ndarray]]
              ) -> Tuple[List[Any], Optional[str]]:
        """Starts pulling chunks' pages from r's prefill into r's pages: (the
        notifications, None), or ([], why not)."""
        instance = self._instances.get(r.token)
        if not isinstance(instance, int):
            return [], (f"kvbm transfer backend: no usable layout of prefill "
                        f"{(r.token or '?')[:8]}: {instance or 'its metadata never came'}")
        src_parts, dst_parts = [], []
        for start, src in chunks:
            if start < 0 or start + len(src) > len(r.dst):
                return [], (f"kvbm transfer backend: the prefill sent pages "
                            f"[{start}, {start + len(src)}) of a request with "
                            f"{len(r.dst)} reserved")
            src_parts.append(src)
            dst_parts.append(r.dst[start:start + len(src)])
        src = np.concatenate(src_parts) if src_parts else np.zeros(0, np.int32)
        dst = np.concatenate(dst_parts) if dst_parts else np.zeros(0, np.int32)
        if len(src) == 0:
            return [], None
        notes: List[Any] = []
        try:
            for w in self.workers:
                notes.append(w.transfer_from_instance(instance, Tier.G1, src, Tier.G1, dst))
        except (KvbmError, ValueError, TypeError) as e:
            for n in notes:
                n.close()
            return [], (f"kvbm transfer backend: starting the pull of {len(src)} pages "
                        f"failed: {e}")
        r.bytes += len(src) * self.kv_item_lens_sum
        return notes, None

    def _await(self, room: int, r: _DecodeRoom, notes: List[Any], deadline: float) -> None:
        fact, why = FactKind.TRANSFER_COMPLETED, None
        for n in notes:
            try:
                if fact == FactKind.TRANSFER_COMPLETED and \
                        not n.wait(max(0.0, deadline - time.time())):
                    fact, why = FactKind.TIMED_OUT, (
                        f"kvbm transfer backend: the pull of room {room} did not finish "
                        f"within SGLANG_DISAGGREGATION_WAITING_TIMEOUT "
                        f"({self.waiting_timeout}s)")
            except KvbmError as e:
                bad = []
                try:
                    bad = n.failed_blocks()
                except KvbmError:
                    pass
                fact, why = FactKind.FAILED, (f"kvbm transfer backend: the pull of room "
                                              f"{room} failed: {e}" +
                                              (f" (pages {bad[:8]})" if bad else ""))
            finally:
                if not n.done():
                    # Timed out: stop the pull, and wait until the library is
                    # done with the pages (then nothing writes them) before
                    # SGLang takes them back.
                    n.cancel()
                    try:
                        n.wait(30.0)
                    except KvbmError:
                        pass
                n.close()
        if self._rooms.get(room) is r:
            self._fact(room, fact, why)

    def _write_aux(self, r: _DecodeRoom) -> Optional[str]:
        rows = r.aux_rows or []
        if len(rows) != len(self.aux):
            return (f"kvbm transfer backend: the prefill sent {len(rows)} aux rows, this decode "
                    f"has {len(self.aux)} aux buffers")
        i = r.aux_index
        for b, ((ptr, item, n), row) in enumerate(zip(self.aux, rows)):
            if len(row) != item:
                return (f"kvbm transfer backend: aux buffer {b}: the prefill's row has "
                        f"{len(row)} bytes, this decode's {item}")
            if i is None or i < 0 or (i + 1) * item > n:
                return f"kvbm transfer backend: aux index {i} is outside aux buffer {b}"
        for (ptr, item, _), row in zip(self.aux, rows):
            ctypes.memmove(ptr + i * item, row, item)
        return None


class KvbmKVSender(CommonKVSender):
    """Prefill side of one request."""

    def _poll_with_status(self, check_status: Any) -> KVPoll:
        status = super()._poll_with_status(check_status)
        if status == KVPoll.Transferring:
            mgr: KvbmKVManager = self.kv_mgr
            pr = mgr._prefill_rooms.get(self.bootstrap_room)
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
        self.kv_mgr._prefill_rooms.pop(self.bootstrap_room, None)

    def abort(self) -> None:
        mgr: KvbmKVManager = self.kv_mgr
        targets = mgr._room_notify_targets(self.bootstrap_room)
        super().abort()
        mgr.send_kv_status_message(targets=targets, bootstrap_room=self.bootstrap_room,
                                   status=KVPoll.Failed,
                                   failure_reason="Aborted by the prefill (AbortReq).")


class KvbmKVReceiver(CommonKVReceiver):
    """Decode side of one request."""

    def init(self, prefill_dp_rank: int) -> None:
        super().init(prefill_dp_rank)
        if self.conclude_state == KVPoll.Failed or not hasattr(self, "prefill_info"):
            return
        mgr: KvbmKVManager = self.kv_mgr
        info = self.prefill_info
        why = None
        if info.pp_size != 1 or info.attn_cp_size != 1 or mgr.pp_size != 1:
            why = f"pipeline or context parallelism (prefill pp {info.pp_size}, cp " \
                  f"{info.attn_cp_size}; decode pp {mgr.pp_size})"
        elif not mgr.is_mla_backend and info.attn_tp_size != mgr.attn_tp_size:
            why = f"different attention TP sizes for a non-MLA model (prefill " \
                  f"{info.attn_tp_size}, decode {mgr.attn_tp_size})"
        elif self.required_prefill_response_num != 1:
            why = f"pulling one request from {self.required_prefill_response_num} prefill ranks"
        if why is not None:
            mgr.record_failure(self.bootstrap_room, f"kvbm transfer backend: {why} is not "
                                                    f"supported")
            mgr.update_status(self.bootstrap_room, KVPoll.Failed)
            self.conclude_state = KVPoll.Failed

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None,
                      state_indices: Optional[List] = None,
                      decode_prefix_len: Optional[int] = None,
                      destination: KVTransferDestination = KVTransferDestination.DEVICE,
                      device_kv_indices: Any = None) -> None:
        mgr: KvbmKVManager = self.kv_mgr
        room = self.bootstrap_room
        if self.conclude_state == KVPoll.Failed or mgr.request_status.get(room) == KVPoll.Failed:
            return
        if destination != KVTransferDestination.DEVICE:
            raise NotImplementedError("kvbm transfer backend: host KV destinations are not "
                                      "supported")
        if state_indices and any(s is not None and len(s) > 0 for s in state_indices):
            mgr.record_failure(room, "kvbm transfer backend: extra state (Mamba/SWA/DSA/...) "
                                     "transfer is not supported")
            mgr.update_status(room, KVPoll.Failed)
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

        mgr._open_room(room, dst, aux_index, targets, submit)

    def _poll(self) -> KVPoll:
        mgr: KvbmKVManager = self.kv_mgr
        room = self.bootstrap_room
        if self.conclude_state is None and self.init_time is not None:
            status = mgr.request_status.get(room)
            elapsed = time.time() - self.init_time
            if status in (KVPoll.WaitingForInput, KVPoll.Transferring) and \
                    elapsed >= mgr.waiting_timeout:
                mgr._fact(room, FactKind.TIMED_OUT, (
                    f"Request {room} timed out after {elapsed:.1f}s in "
                    f"{'KVPoll.WaitingForInput' if status == KVPoll.WaitingForInput else 'KVPoll.Transferring'}"
                    f" (SGLANG_DISAGGREGATION_WAITING_TIMEOUT={mgr.waiting_timeout})"))
        status = super()._poll()
        if status == KVPoll.Failed:
            with mgr.failure_lock:
                why = mgr.failure_records.get(room)
            mgr._fact(room, FactKind.FAILED, why or "failed")
        return status

    def abort(self) -> None:
        super().abort()
        self.kv_mgr._fact(self.bootstrap_room, FactKind.CANCELED, "Aborted by AbortReq.")

    def clear(self) -> None:
        super().clear()
        self.kv_mgr._close_room(self.bootstrap_room)


class KvbmKVBootstrapServer(CommonKVBootstrapServer):
    """SGLang's own bootstrap server (registration, /route, /health)."""

    def close(self) -> None:
        """As SGLang's, which stops nothing when called before its event loop
        runs (a close right after the start): waits for the loop first (5 s
        at most)."""
        deadline = time.monotonic() + 5
        while self.thread.is_alive() and time.monotonic() < deadline:
            loop = getattr(self, "_loop", None)
            if loop is not None and loop.is_running():
                break
            time.sleep(0.01)
        if getattr(self, "_loop", None) is None:
            return  # the server thread died before it made its loop
        super().close()
