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
the prefill worker's registered KV memory, with metadata that reads only
the room's pages and dies with the room (``pd_prefill``).

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

The backend is split by side: ``pd_prefill`` (the prefill's messages and
its requests, ``KvbmKVSender``), ``pd_decode`` (each request's hand-off,
driven by kvbmgo's P/D driver, ``KvbmKVReceiver``) and ``pd_wire`` (the
layout both sides agree on, the control messages, the bootstrap server);
this module is the manager SGLang makes for either side, and the names
SGLang loads.

Bounds: decode, SGLANG_DISAGGREGATION_WAITING_TIMEOUT from send_metadata to
Success (through WaitingForInput and Transferring; kvbm's remote deadline of
each worker is that timeout, at most 30 s), and the heartbeat to the
prefill's bootstrap server (a dead prefill: Failed after
HEARTBEAT_INTERVAL x HEARTBEAT_MAX_FAILURE); prefill,
SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT in Bootstrapping, and
SGLANG_DISAGGREGATION_WAITING_TIMEOUT from its last chunk until the decode
confirms the pull.

State buffers (``KVArgs.state_*``: Mamba, SWA, ...): the moved kinds'
buffers are registered as the KV's are, one more worker per group, and a
room's slots travel with its last chunk (``pd_state``).

Supported: MHA and MLA pools (and a draft pool beside them), the state kinds
of pd_state.MOVED, equal attention TP, PP 1, CP 1; the rest (a refused state
kind among them) ends in Failed with the reason (an MLA model with a larger prefill TP goes through
SGLang's dummy ranks: not tested). Refused when the manager is made: the
decode allocation policy "prefill_complete", and metadata buffers in device
memory (SGLANG_MOONCAKE_CUSTOM_MEM_POOL=INTRA_NODE_NVLINK).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import uuid
from typing import Any, Dict, List, Optional, Tuple, Union

import zmq

from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
from sglang.srt.disaggregation.common.conn import CommonKVManager
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.environ import envs
from sglang.srt.utils.network import NetworkAddress, get_local_ip_auto

from .. import _control
from .._info import backend
from .._memory import Buffer
from .._worker import Worker
from ..errors import KvbmError
from . import pd_state
from . import pd_wire as wire
from .pd_decode import DecodeSide, KvbmKVReceiver
from .pd_prefill import KvbmKVSender, PrefillSide
from .pd_wire import KvbmKVBootstrapServer, kv_groups

__all__ = ["KvbmKVManager", "KvbmKVSender", "KvbmKVReceiver", "KvbmKVBootstrapServer",
           "kv_groups"]

logger = logging.getLogger(__name__)

_worker_ids = itertools.count(1)


def _next_worker_id() -> int:
    # Distinct from the HiCache backend's ids (pid << 24 | n) in one process.
    return (0x5D << 56) | ((os.getpid() & 0xFFFFFFFF) << 20) | next(_worker_ids)


class KvbmKVManager(CommonKVManager):
    """One rank's kvbm transfer manager (prefill or decode)."""

    kv_status_msg_tag = wire.TAG_STATUS
    kv_status_msg_carries_reason = True
    reports_transfer_latency = True

    # SGLang's base makes the control socket's context and binds the socket
    # from it at once, and a bound socket's options no longer reach its
    # connections: the cap is set on the context, as a default of the
    # sockets made from it, the moment the base assigns it.
    @property
    def _zmq_ctx(self) -> Any:
        return self.__dict__["_zmq_ctx"]

    @_zmq_ctx.setter
    def _zmq_ctx(self, ctx: Any) -> None:
        _control.cap_frames(ctx, wire.CONTROL_MAX)
        self.__dict__["_zmq_ctx"] = ctx

    def __init__(self, args: KVArgs, disaggregation_mode: DisaggregationMode,
                 server_args: Any, is_mla_backend: Optional[bool] = False) -> None:
        self.token = uuid.uuid4().hex  # this manager's name on the wire
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self.workers: List[Worker] = []  # the KV groups'
        # state component index -> its groups' workers (pd_state)
        self.state_workers: Dict[int, List[Worker]] = {}
        # The key (_control.choose_key: KVBM_AUTH_KEY / KVBM_AUTH_KEY_FILE, else
        # the same-host key), chosen before any socket is made, for the
        # address SGLang will listen on (and advertise): a bad key, or a
        # non-loopback address without one, refuses the manager.
        ip = get_local_ip_auto()
        self.key_choice = _control.choose_key(wire.LABEL, [ip])
        self.auth = wire.Auth(self.key_choice.key, self.token,
                              "prefill" if disaggregation_mode == DisaggregationMode.PREFILL
                              else "decode")
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        if str(self.local_ip) != ip:  # SGLang chose another address after all
            try:
                _control.refuse_unkeyed(wire.LABEL, [str(self.local_ip)])
            except ValueError:
                self.server_socket.close(linger=0)
                raise
        # A message must name this manager's endpoint: one signed for
        # another instance never verifies here.
        self.auth.me = _control.endpoint(str(self.local_ip), int(self.rank_port))
        if self.defer_decode_allocation:
            self.server_socket.close(linger=0)
            raise ValueError("kvbm transfer backend: --disaggregation-decode-allocation-policy "
                             "prefill_complete is not supported (use early, the default)")
        if envs.SGLANG_MOONCAKE_CUSTOM_MEM_POOL.get() == "INTRA_NODE_NVLINK":
            self.server_socket.close(linger=0)
            raise ValueError("kvbm transfer backend: the metadata buffers must be host memory "
                             "(unset SGLANG_MOONCAKE_CUSTOM_MEM_POOL=INTRA_NODE_NVLINK)")
        try:
            self.states = pd_state.state_components(args)
        except ValueError:
            self.server_socket.close(linger=0)
            raise
        note = pd_state.refused_note(self.states)
        if note:
            logger.warning("%s", note)
        if disaggregation_mode == DisaggregationMode.PREFILL:
            # How long the prefill holds a request's pages for the decode's
            # pull after its last chunk (SGLang's decode-side setting).
            self.waiting_timeout = envs.SGLANG_DISAGGREGATION_WAITING_TIMEOUT.get()
        self.groups = kv_groups(args.kv_data_lens, args.kv_item_lens)
        self.aux = [(int(p), int(item), int(n)) for p, item, n in
                    zip(args.aux_data_ptrs, args.aux_item_lens, args.aux_data_lens)]
        self.signature = wire.signature(self.groups, [a[1] for a in self.aux],
                                        pd_state.signature(self.states))
        self._register(args)
        self.side: Union[PrefillSide, DecodeSide]
        if disaggregation_mode == DisaggregationMode.PREFILL:
            self.side = PrefillSide(self)
            self._spawn(lambda: self._message_loop(self.side.on_message), "kvbm-prefill")
        else:
            self.side = DecodeSide(self)
            self._spawn(lambda: self._message_loop(self.side.on_message), "kvbm-decode")
            self._heartbeat = self._start_heartbeat_checker_thread()

    # ---- setup and teardown

    def _register(self, args: KVArgs) -> None:
        """Registers SGLang's KV buffers, unchanged, as G1 of one worker per group."""
        cuda = backend() == "cuda"
        gpu = int(getattr(args, "gpu_id", 0) or 0)
        def worker(g: wire.KVGroup, ptrs: List[int]) -> Worker:
            # Each operation on the peer's memory ends within the request's
            # own bound (kvbm's default is 30 s): a pull that outlives the
            # waiting timeout would write pages SGLang has taken back.
            # The data plane listens (from the first export) on the
            # address this side was given, which its peers dial.
            w = Worker(_next_worker_id(), device_id=gpu if cuda else 0,
                       rank=int(getattr(args, "engine_rank", 0) or 0),
                       remote_deadline=min(30.0, max(1.0, float(self.waiting_timeout))),
                       advertise_host=str(self.local_ip))
            try:
                cfg = g.layout()
                w.register_g1(cfg, [Buffer(int(ptrs[i]), cfg.layer_bytes, 1,
                                           gpu if cuda else None, None) for i in g.buffers])
            except BaseException:
                w.close()
                raise
            return w

        try:
            for g in self.groups:
                self.workers.append(worker(g, args.kv_data_ptrs))
            for c in self.states:  # the moved kinds' buffers, as the KV's
                for g in c.groups:
                    self.state_workers.setdefault(c.index, []).append(
                        worker(g, args.state_data_ptrs[c.index]))
        except BaseException:
            self.close()
            raise
        logger.info("kvbm transfer backend (%s): %d KV buffers in %d group(s) %s, %d aux "
                    "buffers, state %s", self.disaggregation_mode.value,
                    len(args.kv_data_ptrs), len(self.groups),
                    [(len(g.buffers), g.num_pages, g.item_len) for g in self.groups],
                    len(self.aux), [(c.name, [(len(g.buffers), g.num_pages, g.item_len)
                                              for g in c.groups]) for c in self.states])

    @property
    def all_workers(self) -> List[Worker]:
        """The KV groups' workers, then the state components'."""
        return self.workers + [w for ws in self.state_workers.values() for w in ws]

    def _message_loop(self, handle: Any) -> None:
        """Hands every message received, authenticated (wire.Auth), to
        handle(frames, sender token or None) until the socket closes."""
        while True:
            msg = self._recv()
            if msg is None:
                return
            try:
                opened = self.auth.open(msg)
                if opened is None:
                    continue  # refused (counted and logged)
                handle(*opened)
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
        side = getattr(self, "side", None)
        if isinstance(side, DecodeSide):
            side.close()
        for w in self.all_workers:
            try:
                w.close()
            except KvbmError as e:
                logger.warning("kvbm transfer backend: closing a worker: %s", e)
        self.workers, self.state_workers = [], {}
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
        frames = self.auth.sign(frames, _control.endpoint(endpoint[0], int(endpoint[1])))
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

    def _send_multipart_locked(self, endpoint: str, parts: List[bytes],
                               is_ipv6: bool = False) -> None:
        # SGLang's own messages (status, abort acknowledgements), signed for
        # the endpoint ("tcp://host:port") they go to.
        host, _, port = endpoint.partition("://")[2].rpartition(":")
        super()._send_multipart_locked(
            endpoint, self.auth.sign(parts, _control.endpoint(host, int(port))),
            is_ipv6=is_ipv6)

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

    def update_status(self, bootstrap_room: int, status: Any) -> None:
        # A prefill room that ends (Success, Failed) first has its pages'
        # metadata revoked: SGLang frees the pages once it polls that status.
        side = getattr(self, "side", None)
        if isinstance(side, PrefillSide) and status in (KVPoll.Success, KVPoll.Failed):
            side.revoke(bootstrap_room)
        super().update_status(bootstrap_room, status)

    # ---- messages the common receiver sends (decode -> prefill)

    def build_receiver_registration_message(self) -> List[bytes]:
        # A fresh nonce per registration: the decode takes a KVBM_META only
        # as the answer to one it sent.
        nonce = _control.new_token()
        self.side.expect_layouts(nonce)
        return wire.registration(self.local_ip, self.rank_port, self.token, self.signature,
                                 nonce)

    def build_receiver_metadata_message(self, *, bootstrap_room: int, required_dst_info_num: int,
                                        kv_indices: Any, aux_index: Optional[int],
                                        state_indices: Optional[List],
                                        decode_prefix_len: Optional[int], is_dummy: bool,
                                        device_kv_indices: Any = None) -> List[bytes]:
        return wire.TransferInfo(
            room=bootstrap_room, endpoint=self.local_ip, dst_port=self.rank_port,
            peer=self.token, num_pages=0 if is_dummy else len(kv_indices),
            required_dst_info_num=required_dst_info_num,
            decode_prefix_len=decode_prefix_len or 0, is_dummy=is_dummy).frames()

    # ---- what SGLang's sender calls (prefill)

    def add_transfer_request(self, bootstrap_room: int, kv_indices: Any, index_slice: slice,
                             is_last_chunk: bool, aux_index: Optional[int] = None,
                             state_indices: Optional[List] = None,
                             num_kv_tokens: Optional[int] = None, *, wait_event: Any = None,
                             indices_event: Any = None, trace_ctx: Any = None) -> None:
        """Tells the decode ranks which of this rank's pages hold the chunk
        (and, with the last chunk, the aux row): they pull them."""
        self.side.add_transfer_request(bootstrap_room, kv_indices, index_slice, is_last_chunk,
                                       aux_index, state_indices, wait_event=wait_event,
                                       indices_event=indices_event)
