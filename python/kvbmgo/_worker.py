"""A worker: its tiers, transfers, metadata, remotes and object store."""

from __future__ import annotations

import ctypes
import weakref
from ctypes import byref, c_size_t, c_uint8, c_void_p, sizeof
from os import PathLike, fspath
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _lib
from ._cint import Ids, int32, metadata_bytes, millis, transfer_ids, uint64
from ._cache import PrefixCache, WriteMode, enable as _enable_cache
from ._counters import PathCounters, TransferPath
from ._device import Event, Stream, pointer_of
from ._handle import Handle
from ._info import backend
from ._layout import LayoutConfig, LayoutHandle, LayoutKind, handle_of
from ._lib import lib
from ._memory import buffer_of
from ._notification import Notification
from ._objects import ObjectOps
from ._options import HeadSlice, options
from ._scope import block_scope
from .errors import (BufferTooSmallError, FailedPreconditionError, InvalidArgumentError,
                     InvalidHandleError, KvbmClosedError, KvbmError)

__all__ = ["Worker"]


#: worker_id -> the live Worker of this process with that id, so that an
#: import of bytes metadata can keep the exporter's G1 memory alive.
_workers: "weakref.WeakValueDictionary[int, Worker]" = weakref.WeakValueDictionary()

#: G1 memory of workers whose destroy failed: the library may still use it,
#: so it is kept for the life of the process.
_stranded: List[Any] = []


class Worker(ObjectOps, Handle):
    """A worker with its own transfer manager on the active device backend.

    It keeps the memory registered as G1 alive until it is closed (or
    collected). Safe to use from many threads at once.
    """

    __slots__ = ("worker_id", "device_id", "_g1", "_remotes", "_dependents", "_cache")
    _kind = "Worker"

    def __init__(self, worker_id: int, *, device_id: int = 0, rank: int = 0,
                 disk_dir: Union[str, "PathLike[str]", None] = None,
                 object_dir: Union[str, "PathLike[str]", None] = None,
                 remote_deadline: Optional[float] = None,
                 advertise_host: Optional[str] = None,
                 g3_persist_id: Optional[str] = None) -> None:
        """Creates a worker on device device_id of the active backend.
        worker_id must be unique among the live workers of the process;
        disk_dir enables G3, object_dir the G4 object store: a directory,
        "file:///path" or "s3://bucket/prefix" (credentials from the AWS_*
        variables; see docs/data-plane.md). remote_deadline (seconds; default 30)
        bounds each operation on another process's memory: a dead, frozen or
        unreachable peer fails the transfer's blocks within it. The worker
        serves its layouts to other processes on the transport KVBM_TRANSPORT
        selects (kvbmgo.info().transport); over TCP it listens from its first
        metadata export on advertise_host (the host peers dial: the address a
        P/D role is given; None: KVBM_TCP_ADVERTISE, else 127.0.0.1).
        g3_persist_id makes G3 persistent (a warm restart; kvbm.h's
        g3_persist_id): its file stays in disk_dir with a journal, and a
        later worker with the same id and G3 layout finds its keys again,
        each block checked against its checksums first. Raises
        InvalidArgumentError (a
        malformed location, no S3 credentials, no such device; worker_id does
        not fit a uint64, device_id or rank an int32; remote_deadline not
        within (0, 2**32) ms), TypeError (one is not an integer),
        AlreadyExistsError (worker_id in use), KvbmIOError (object_dir cannot
        be created; an S3 server that refuses the credentials, lacks the
        bucket or does not answer), KvbmTimeoutError (an S3 server silent for
        30 s), FailedPreconditionError (an object_dir directory not owned by
        this user, or writable by its group or others: kvbm makes its
        directories 0700 and its files 0600), UnsupportedError / CudaError
        (device backend)."""
        worker_id = uint64(worker_id, "worker_id")
        device_id = int32(device_id, "device_id")
        c = _lib.WorkerConfigC()
        c.struct_size = sizeof(c)
        c.device_id, c.rank, c.worker_id = device_id, int32(rank, "rank"), worker_id
        c.disk_dir = fspath(disk_dir).encode() if disk_dir is not None else None
        c.object_dir = fspath(object_dir).encode() if object_dir is not None else None
        if remote_deadline is not None:
            c.remote_deadline_ms = millis(remote_deadline, "remote_deadline")
        c.advertise_host = advertise_host.encode() if advertise_host else None
        c.g3_persist_id = g3_persist_id.encode() if g3_persist_id else None
        h = c_void_p()
        lib.kvbm_worker_create(byref(c), byref(h))
        self.worker_id = worker_id
        self.device_id = device_id
        # Registered G1 memory, kept alive. The list object itself is shared
        # with the workers that import this one's layouts: they keep it (not
        # this worker) alive, so close() rebinds it and never empties it.
        self._g1: List[Any] = []
        # What we imported: exporters (Worker form) and their G1 lists.
        self._remotes: List[Any] = []
        # The CoordinatedWorkers over this one, closed first by close().
        self._dependents: "weakref.WeakSet[Handle]" = weakref.WeakSet()
        self._cache: Optional[PrefixCache] = None
        # The lists travel with the finalizer: the memory outlives the destroy.
        self._own(h.value, lib.kvbm_worker_destroy, self._g1, self._remotes)
        _workers[worker_id] = self

    def close(self) -> None:
        """Closes the coordinated workers over this one, waits for transfers in
        flight, releases G2/G3, then lets go of the registered G1 memory (which
        workers that imported this one's layouts keep alive until they close).
        Raises the first error of a failed destroy (InvalidHandleError: the
        handle was freed behind its back, ...), after closing everything: G1
        memory of a worker whose destroy failed is then kept for good."""
        first: Optional[BaseException] = None
        for dep in list(self._dependents):
            try:
                dep.close()
            except Exception as e:  # noqa: BLE001 - still close the worker
                first = first or e
        g1, remotes = self._g1, self._remotes
        try:
            super().close()
        except KvbmError as e:
            if not isinstance(e, InvalidHandleError):  # not surely destroyed
                _stranded.append((g1, remotes))
            first = first or e
        self._g1, self._remotes = [], []
        if _workers.get(self.worker_id) is self:
            del _workers[self.worker_id]
        if first is not None:
            raise first

    # ---- tiers

    def register_g1(self, config: LayoutConfig, buffers: Union[Any, Sequence[Any]]
                    ) -> LayoutHandle:
        """Registers the engine's KV cache as G1: one buffer per layer for
        layer_separate, one for fully_contiguous (numpy arrays or torch
        tensors; under the emulated device, host arrays become device memory).

        Raises TypeError (not a buffer, dtype width != config.dtype_width, a
        host array under the cuda backend, a CUDA tensor under another),
        ValueError (count or byte size mismatch, not C-contiguous, read-only,
        a CUDA tensor on another device than device_id), AlreadyExistsError (G1
        registered), CudaError, InvalidArgumentError."""
        h = self.handle
        descs = self._buffers("register_g1", config, buffers)
        active = backend()
        for i, d in enumerate(descs):
            if d.device is None:
                if active == "cuda":
                    raise TypeError("register_g1: host memory cannot be G1 under the cuda "
                                    "backend; pass CUDA tensors")
            elif active != "cuda":
                raise TypeError(f"register_g1 buffer {i}: a CUDA tensor (cuda:{d.device}) "
                                f"under the {active} backend, which takes host memory")
            elif d.device != self.device_id:
                raise ValueError(f"register_g1 buffer {i}: a tensor on cuda:{d.device}, "
                                 f"the worker is on device {self.device_id}")
        ptrs = (ctypes.c_uint64 * len(descs))(*(d.address for d in descs))
        out = _lib.LayoutHandleC()
        cfg = config.to_c()
        lib.kvbm_worker_register_g1(h, byref(cfg), ptrs, len(descs), byref(out))
        self._g1.extend(d.owner for d in descs)
        return handle_of(out)

    def unregister_g1(self, reason: Optional[str] = None) -> None:
        """Takes G1 away before its memory goes to another use (vLLM's sleep
        mode and weight updates): every transfer on G1 from now on, this
        worker's or a peer's through metadata exported before, fails with
        FailedPreconditionError saying G1 was unregistered by its owner and
        reason (up to 512 bytes);
        returns once the transfers in flight on G1 have finished, after
        which the library touches none of its memory. register_g1 (or
        register_g1_host) again, with the config it had, when the memory is
        back; it has a new handle, so export metadata anew. Raises
        NotFoundError (G1 not registered)."""
        lib.kvbm_worker_unregister_g1(self.handle,
                                      None if reason is None else reason.encode("utf-8"))
        self._g1.clear()

    def register_g1_host(self, config: LayoutConfig, buffers: Union[Any, Sequence[Any]]
                         ) -> LayoutHandle:
        """Registers host memory the engine owns (numpy arrays or CPU torch
        tensors) as G1, under either device backend: for engines whose working
        KV lives in host memory (SGLang's HiCache host pool). Pinned by the
        library, or used as it is when CUDA has it pinned already. The prefix
        cache and plain transfers work on it; layer-wise onboard needs device
        G1. Raises as register_g2."""
        return self._register_host("register_g1_host", lib.kvbm_worker_register_g1_host,
                                   config, buffers)

    def register_g2(self, config: LayoutConfig, buffers: Union[Any, Sequence[Any]]
                    ) -> LayoutHandle:
        """Registers host memory the engine owns (its host KV pool: numpy
        arrays or CPU torch tensors, one per layer for layer_separate, one for
        fully_contiguous) as G2, pinned by the library: transfers read and
        write it in place. The worker keeps the buffers alive until it closes.

        Raises TypeError (not a buffer, dtype width != config.dtype_width, a
        CUDA tensor), ValueError (count or byte size mismatch, not C-contiguous,
        read-only), AlreadyExistsError (G2 registered or allocated), CudaError
        (memory already pinned with CUDA), InvalidArgumentError."""
        return self._register_host("register_g2", lib.kvbm_worker_register_g2, config, buffers)

    def _register_host(self, what: str, call: Any, config: LayoutConfig,
                       buffers: Union[Any, Sequence[Any]]) -> LayoutHandle:
        descs = self._buffers(what, config, buffers)
        for i, d in enumerate(descs):
            if d.device is not None:
                raise TypeError(f"{what} buffer {i}: a CUDA tensor (cuda:{d.device}); "
                                "this registers host memory")
        ptrs = (ctypes.c_uint64 * len(descs))(*(d.address for d in descs))
        out = _lib.LayoutHandleC()
        cfg = config.to_c()
        call(self.handle, byref(cfg), ptrs, len(descs), byref(out))
        self._g1.extend(d.owner for d in descs)  # kept alive as G1 memory is
        return handle_of(out)

    def _buffers(self, what: str, config: LayoutConfig, buffers: Union[Any, Sequence[Any]]
                 ) -> List[Any]:
        """The buffer descriptions of a register call, checked against config."""
        if not isinstance(buffers, (list, tuple)):
            buffers = [buffers]
        separate = config.layout_kind == LayoutKind.LAYER_SEPARATE
        want_n = config.num_layers if separate else 1
        if len(buffers) != want_n:
            raise ValueError(f"{what}: {len(buffers)} buffers for a "
                             f"{'layer_separate' if separate else 'fully_contiguous'} layout "
                             f"that needs {want_n}")
        want_bytes = config.layer_bytes if separate else config.total_bytes
        descs = []
        for i, b in enumerate(buffers):
            d = buffer_of(b, f"{what} buffer {i}")
            if d.itemsize != config.dtype_width:
                raise TypeError(f"{what} buffer {i}: element size {d.itemsize} != "
                                f"dtype_width {config.dtype_width}")
            if d.nbytes != want_bytes:
                raise ValueError(f"{what} buffer {i}: {d.nbytes} bytes, the layout needs "
                                 f"{want_bytes}")
            descs.append(d)
        return descs

    def register_kv_caches(self, kv_caches: Union[Mapping[str, Any], Sequence[Any]], *,
                           page_size: Optional[int] = None,
                           layout: Union[str, int] = "layer_separate",
                           block_dim: Union[str, int] = "second"
                           ) -> Tuple[LayoutConfig, LayoutHandle]:
        """LayoutConfig.from_kv_caches, then register_g1 with those tensors.
        Returns the inferred config (e.g. to allocate G2 alike) and the handle.
        Raises as LayoutConfig.from_kv_caches and register_g1."""
        cfg = LayoutConfig.from_kv_caches(kv_caches, page_size=page_size, layout=layout,
                                          block_dim=block_dim)
        tensors = list(kv_caches.values()) if isinstance(kv_caches, Mapping) else list(kv_caches)
        return cfg, self.register_g1(cfg, tensors)

    def allocate_g2(self, config: LayoutConfig) -> LayoutHandle:
        """Allocates G2 (pinned host memory, owned by the worker). Raises
        AlreadyExistsError (G2 registered or allocated), CudaError (the
        allocation; also more than the host or the memory cgroup can hold,
        refused before a page is touched, the message naming the bytes
        requested and available), InvalidArgumentError (the config), and
        what config.to_c() raises."""
        out = _lib.LayoutHandleC()
        cfg = config.to_c()
        lib.kvbm_worker_allocate_g2(self.handle, byref(cfg), byref(out))
        return handle_of(out)

    def allocate_g3(self, config: LayoutConfig) -> LayoutHandle:
        """Allocates G3 (a file in disk_dir that has no name, so nothing stays
        on disk after the process ends, even by SIGKILL). Raises
        InvalidArgumentError (no disk_dir, the config), AlreadyExistsError
        (G3 allocated), KvbmIOError (the file; also larger than the free disk
        space, the message naming the bytes requested and free),
        FailedPreconditionError (disk_dir not owned by this user, or writable
        by its group or others), and what config.to_c() raises."""
        out = _lib.LayoutHandleC()
        cfg = config.to_c()
        lib.kvbm_worker_allocate_g3(self.handle, byref(cfg), byref(out))
        return handle_of(out)

    # ---- transfers

    def transfer(self, src: int, src_ids: Ids, dst: int, dst_ids: Ids, *,
                 layers: Optional[Tuple[int, int]] = None,
                 stream: "Union[Stream, int, None]" = None,
                 precondition: "Union[Event, int, None]" = None) -> Notification:
        """Copies blocks src_ids of tier src into blocks dst_ids of tier dst.
        layers is a half-open range (start, end); precondition an event the copy
        waits for before it reads. Returns the Notification (close it).
        Raises ValueError (lengths differ, a numpy array of ids that is not
        1-D), OutOfRangeError (an InvalidArgumentError and an IndexError: an
        id beyond the layout; a layer range that is empty or not within the
        layers), InvalidArgumentError (no ids, a destination repeated, a block
        both source and destination in one layout, a tier outside G1..G3; an
        integer that does not fit its C type: a tier an int32, an id or a
        layer a uint32), TypeError (a bool or a non-integer; a stream or
        precondition that is neither a Stream/Event, an int nor None),
        NotFoundError (tier not registered), UnsupportedError (no path between
        the tiers), CudaError (the driver; an unknown stream or event),
        CanceledError (the worker is closing)."""
        # The hot path of an engine: kept to what each call needs.
        s, sa, d, da, n = transfer_ids(src_ids, dst_ids)
        h = self._h
        if h is None:
            raise KvbmClosedError("Worker is closed")
        opts = (None if layers is None and stream is None and precondition is None
                else options(layers, stream, precondition))
        out = c_void_p()
        lib.kvbm_worker_transfer(h, int32(src, "src"), sa, int32(dst, "dst"), da, n, opts,
                                 byref(out))
        return Notification(out.value)

    def onboard_layerwise(self, src_ids: Ids, dst_ids: Ids, events: "Sequence[Union[Event, int]]",
                          stream: "Union[Stream, int, None]" = None) -> Notification:
        """Onboards G2 -> G1 one layer at a time, recording events[L] right
        after layer L's copies (one event per layer). Raises as transfer(),
        InvalidArgumentError for a number of events that is not the number of
        layers."""
        s, sa, d, da, n = transfer_ids(src_ids, dst_ids)
        ev = (c_void_p * len(events))(*(pointer_of(e, Event, "events") for e in events))
        out = c_void_p()
        lib.kvbm_worker_onboard_layerwise(self.handle, sa, da, n, ev, len(events),
                                          pointer_of(stream, Stream, "stream"), byref(out))
        return Notification(out.value)

    # ---- metadata and remotes

    def export_metadata(self, read_only: bool = False, *,
                        blocks: Optional[Mapping[int, Ids]] = None,
                        expires: Optional[float] = None) -> bytes:
        """The worker's layout metadata (every registered tier), for another
        worker's import_metadata / connect_remote. It is a capability, a
        secret to give only to the peers meant to hold it: its holder may
        read and write the worker's layouts, or only read them with
        read_only (its writes are then refused: UnsupportedError).

        blocks ({Tier.G1: ids, ...}) scopes it to those blocks of those
        tiers, read only (read_only is then implied): the metadata names
        those tiers only, and the worker refuses its holder any other block
        (UnsupportedError at the reader), for expires seconds from now when
        given (then refused too). What a prefill hands the decode of one
        request. Raises UnsupportedError for read_only or blocks on a
        transport that cannot scope (UCX), InvalidArgumentError /
        OutOfRangeError / NotFoundError for a bad scope (no blocks, a block
        beyond its tier, a tier not registered), nothing else beyond what
        any call may (see kvbmgo.errors)."""
        h = self.handle
        if blocks is None:
            if expires is not None:
                raise ValueError("export_metadata: expires scopes blocks; pass blocks too")
            flags = 1 if read_only else 0  # KVBM_EXPORT_READ_ONLY
            return self._export(lambda buf, cap, size: lib.kvbm_worker_export_metadata_scoped(
                h, flags, buf, cap, size))
        scope = block_scope(blocks, expires)
        return self._export(lambda buf, cap, size: lib.kvbm_worker_export_metadata_blocks(
            h, byref(scope), buf, cap, size))

    def revoke_blocks(self, blocks: Mapping[int, Ids]) -> None:
        """Ends the block-scoped metadata (export_metadata(blocks=...))
        made before this call that covers any of blocks ({Tier.G1: ids,
        ...}): its holders are refused those blocks from now on
        (UnsupportedError at the reader), and the call returns once no read
        it allowed is still under way. Call it before the blocks go to
        their next owner (a P/D prefill: a request released, its lease
        ended, aborted); metadata exported afterwards reads them. Whole-
        worker metadata is not revoked. Raises InvalidArgumentError /
        OutOfRangeError / NotFoundError for a bad tier or block (nothing
        revoked then)."""
        lib.kvbm_worker_revoke_blocks(self.handle, byref(block_scope(blocks)))

    @staticmethod
    def _export(call: Any) -> bytes:
        """Runs an export call into a buffer of the size it asks for."""
        size = c_size_t()
        try:
            call(None, 0, byref(size))
        except BufferTooSmallError:
            pass
        while True:
            buf = (c_uint8 * size.value)()
            try:
                call(buf, size.value, byref(size))
                return bytes(buf[:size.value])
            except BufferTooSmallError:
                continue

    @staticmethod
    def exporter_id(metadata: bytes) -> Optional[int]:
        """The worker_id of the worker that exported metadata (bytes from
        export_metadata, in any process), or None for bytes that are not
        well-formed metadata (importing them says why). Read without
        importing anything: what a P/D decode checks a prefill's answer
        against (the worker it asked for) before it connects."""
        wid = ctypes.c_uint64()
        try:
            lib.kvbm_metadata_worker_id(metadata, len(metadata), byref(wid))
        except InvalidArgumentError:
            return None
        return wid.value

    def _metadata(self, source: "Union[bytes, Worker]") -> Tuple[Any, int]:
        if isinstance(source, Worker):
            self._remotes.append(source)  # the exporter must outlive our use
            b = metadata_bytes(source.export_metadata())
        else:
            b = metadata_bytes(source)
        self._pin_exporter(b[0])
        return b

    def _pin_exporter(self, md: bytes) -> None:
        """Keeps the G1 memory of md's exporter (a live Worker of this process)
        alive while this worker lives, even past the exporter's close(): a
        transfer of ours may still read or write it."""
        wid = Worker.exporter_id(md)
        exporter = _workers.get(wid) if wid is not None else None
        if exporter is not None and exporter is not self and not exporter.closed:
            g1 = exporter._g1
            if not any(r is g1 for r in self._remotes):
                self._remotes.append(g1)

    def import_metadata(self, source: "Union[bytes, Worker]") -> None:
        """Imports another in-process worker's metadata (bytes, or the Worker
        itself, which is then kept alive) so its layouts can be sources.
        Raises InvalidArgumentError (empty or own metadata, an endpoint that
        does not parse), DataCorruptionError (bytes that do not decode, or
        another metadata version), NotFoundError (the exporter is gone, or the
        peer now runs another worker), UnsupportedError (no transport in
        common), KvbmIOError (the peer cannot be reached or did not answer
        within the deadline)."""
        b, n = self._metadata(source)
        lib.kvbm_worker_import_metadata(self.handle, b, n)

    def connect_remote(self, instance: int, source: "Union[bytes, Worker]") -> None:
        """As import_metadata, remembering the layouts under instance for
        transfer_from_instance. Raises as import_metadata, InvalidArgumentError
        for an instance that does not fit a uint64."""
        b, n = self._metadata(source)
        instance = uint64(instance, "instance")
        lib.kvbm_worker_connect_remote(self.handle, instance, b, n)

    def disconnect_remote(self, instance: int) -> None:
        """Forgets a connected instance: its layouts are no longer imported and
        the connection to its worker closes; transfers in flight on it fail.
        Raises NotFoundError when instance is not connected."""
        lib.kvbm_worker_disconnect_remote(self.handle, uint64(instance, "instance"))

    def transfer_from_instance(self, instance: int, src: int, src_ids: Ids, dst: int,
                               dst_ids: Ids, *, layers: Optional[Tuple[int, int]] = None,
                               stream: "Union[Stream, int, None]" = None,
                               precondition: "Union[Event, int, None]" = None,
                               deadline: Optional[float] = None,
                               heads: Optional[HeadSlice] = None) -> Notification:
        """Pulls blocks of a connected instance's tier src into local tier dst.
        deadline (seconds) bounds the pull as a whole (its blocks then fail with
        DeadlineExceededError, a CanceledError as after Notification.cancel());
        heads pulls a slice of each block's KV heads. Raises as transfer(),
        NotFoundError for an unknown instance or tier, InvalidArgumentError for
        a deadline not within (0, 2**32) ms or a head slice that does not fit
        the layouts."""
        s, sa, d, da, n = transfer_ids(src_ids, dst_ids)
        out = c_void_p()
        lib.kvbm_worker_transfer_from_instance(self.handle, uint64(instance, "instance"),
                                               int32(src, "src"), sa, int32(dst, "dst"), da, n,
                                               options(layers, stream, precondition, deadline,
                                                       heads), byref(out))
        return Notification(out.value)

    def transfer_from_remote(self, remote: LayoutHandle, src_ids: Ids, dst: int, dst_ids: Ids,
                             *, layers: Optional[Tuple[int, int]] = None,
                             stream: "Union[Stream, int, None]" = None,
                             precondition: "Union[Event, int, None]" = None,
                             deadline: Optional[float] = None,
                             heads: Optional[HeadSlice] = None) -> Notification:
        """Pulls blocks src_ids of another worker's layout remote (imported with
        import_metadata) into local tier dst (heads: as transfer_from_instance). Raises as
        transfer_from_instance(), NotFoundError when remote was not imported,
        InvalidArgumentError or TypeError for a remote whose fields are not
        uint64s."""
        s, sa, d, da, n = transfer_ids(src_ids, dst_ids)
        r, out = LayoutHandle(*remote).to_c("remote"), c_void_p()
        lib.kvbm_worker_transfer_from_remote(self.handle, byref(r), sa, int32(dst, "dst"), da, n,
                                             options(layers, stream, precondition, deadline, heads),
                                             byref(out))
        return Notification(out.value)

    def transfer_to_remote(self, src: int, src_ids: Ids, remote: LayoutHandle, dst_ids: Ids,
                           *, layers: Optional[Tuple[int, int]] = None,
                           stream: "Union[Stream, int, None]" = None,
                           precondition: "Union[Event, int, None]" = None,
                           deadline: Optional[float] = None) -> Notification:
        """Pushes blocks src_ids of local tier src into blocks dst_ids of another
        worker's imported layout remote (offload to a peer). Raises as
        transfer_from_remote()."""
        s, sa, d, da, n = transfer_ids(src_ids, dst_ids)
        r, out = LayoutHandle(*remote).to_c("remote"), c_void_p()
        lib.kvbm_worker_transfer_to_remote(self.handle, int32(src, "src"), sa, byref(r), da, n,
                                           options(layers, stream, precondition, deadline),
                                           byref(out))
        return Notification(out.value)

    def counters(self) -> "Dict[TransferPath, PathCounters]":
        """Totals per path (transfers, blocks, bytes, failed_blocks,
        nanoseconds) since the worker was created; object store calls are not
        counted. Cheap; any thread."""
        c = _lib.CountersC()
        c.struct_size = sizeof(c)
        lib.kvbm_worker_counters(self.handle, byref(c))
        return {TransferPath(i): PathCounters(p.transfers, p.blocks, p.bytes, p.failed_blocks,
                                      p.nanoseconds)
                for i, p in enumerate(c.paths)}

    # ---- prefix cache

    def enable_cache(self, *, admit_after: int = 0, g3: Union[WriteMode, str] = WriteMode.AUTO,
                     g4: Union[WriteMode, str] = WriteMode.AUTO, max_events: int = 0
                     ) -> PrefixCache:
        """Gives the worker its prefix cache over G2 (and G3 and the object
        store when it has them); register G1 and allocate G2 first. Once per
        worker. admit_after: offload a key once it was offered (or
        onboarded) that many times (0 or 1: always); g3, g4: when blocks are
        written down (WriteMode or its name, "write-back" ...); max_events:
        events kept until drained (0: 65,536). Raises NotFoundError (no G1 or
        G2), AlreadyExistsError (enabled already), ValueError (a mode that is
        not a WriteMode), InvalidArgumentError (admit_after or max_events not
        a uint32), TypeError."""
        self._cache = _enable_cache(self, admit_after, g3, g4, max_events)
        return self._cache

    @property
    def cache(self) -> PrefixCache:
        """The prefix cache made by enable_cache(). Raises
        FailedPreconditionError before that."""
        if self._cache is None:
            raise FailedPreconditionError("the worker has no cache; call enable_cache() first")
        return self._cache

    # ---- object store (G4)
