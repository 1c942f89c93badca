"""Workers, notifications, hand-off coordinators, streams and events."""

from __future__ import annotations

import asyncio
import ctypes
import enum
import math
import struct
import threading
import uuid
import weakref
from ctypes import byref, c_char_p, c_int32, c_size_t, c_uint8, c_void_p, sizeof
from dataclasses import dataclass
from os import PathLike, fspath
from typing import (Any, Callable, Dict, Generator, Iterable, List, Mapping, NamedTuple, Optional,
                    Sequence, Tuple, Union)

from . import _lib
from ._lib import KVBM_HANDOFF_MAX_ACTIONS, KVBM_IN_PROGRESS, KVBM_OK, lib
from ._memory import LayoutConfig, LayoutKind, block_ids, buffer_of
from .errors import (BufferTooSmallError, FailedPreconditionError, InvalidHandleError,
                     KvbmClosedError, KvbmError, KvbmTimeoutError)

__all__ = [
    "Tier", "LayoutHandle", "Info", "info", "version", "handle_count", "status_string",
    "Stream", "Event", "Notification", "Worker", "CoordinatedWorker",
    "HandoffOrder", "FactKind", "TimingMode", "ActionKind", "OutcomeKind", "Completion",
    "Action", "HandoffCoordinator", "TransferPath", "PathCounters",
]

Ids = Union[Sequence[int], Any]  # a sequence of ints or an integer numpy array
Key = Union[bytes, bytearray, str]


class Tier(enum.IntEnum):
    """KVBM_TIER_*."""
    G1 = 1  # the engine's KV cache in device memory
    G2 = 2  # pinned host memory, allocated by kvbm
    G3 = 3  # local disk, allocated by kvbm


class LayoutHandle(NamedTuple):
    """A registered layout: the owning worker's id and the layout's id within it."""
    worker: int
    layout: int

    def to_c(self) -> _lib.LayoutHandleC:
        return _lib.LayoutHandleC(self.worker, self.layout)


def _handle(c: _lib.LayoutHandleC) -> LayoutHandle:
    return LayoutHandle(c.worker, c.layout)


# ---------------------------------------------------------------- library


@dataclass(frozen=True)
class Info:
    """What kvbm_info reports."""
    version: int
    abi_version: int
    device_backend: str
    device_count: int


def info() -> Info:
    """The library's version, ABI version and device backend. Opens the backend
    (KVBM_DEVICE) if not yet open; raises UnsupportedError or CudaError if it
    cannot."""
    c = _lib.InfoC()
    c.struct_size = sizeof(c)
    lib.kvbm_info(byref(c))
    return Info(c.version, c.abi_version, c.device_backend.decode(), c.device_count)


def version() -> Tuple[int, int, int]:
    """The library's (major, minor, patch). Never fails."""
    v = lib.kvbm_version()
    return v // 10000, v // 100 % 100, v % 100


def handle_count() -> int:
    """Live handles of every kind (workers, coordinated workers, notifications,
    hand-off coordinators); 0 once everything created has been closed."""
    n = c_size_t()
    lib.kvbm_handle_count(byref(n))
    return n.value


def status_string(status: int) -> str:
    """The name of a status code ("KVBM_ERR_INVALID_HANDLE")."""
    return lib.kvbm_status_string(status).decode()


# ------------------------------------------------------------ closing base


def _finalize(free: Callable[[int], Any], handle: int, *keep: Any) -> None:
    """The finalizer of a forgotten object: frees its handle, never raises. keep
    holds what must outlive the handle (e.g. registered G1 memory)."""
    try:
        free(handle)
    except KvbmError:
        pass


class _Handle:
    """An owned libkvbm handle: close(), a context manager, weakref.finalize."""

    __slots__ = ("_h", "_finalizer", "__weakref__")
    _kind = "object"

    def _own(self, handle: int, free: Callable[[int], Any], *keep: Any) -> None:
        self._h: Optional[int] = handle
        # The finalizer holds the handle and free function, never self.
        self._finalizer = weakref.finalize(self, _finalize, free, handle, *keep)

    @property
    def handle(self) -> int:
        """The raw C handle (an int). Raises KvbmClosedError after close()."""
        h = self._h
        if h is None:
            raise KvbmClosedError(f"{self._kind} is closed")
        return h

    @property
    def closed(self) -> bool:
        return self._h is None

    def close(self) -> None:
        """Frees the handle; a second close does nothing. Raises the library's
        error if the free fails (the object is closed all the same; only the
        finalizer of a forgotten object stays silent)."""
        self._h = None
        fin = getattr(self, "_finalizer", None)
        if fin is None:
            return
        detached = fin.detach()
        if detached is not None:
            _, _, args, _ = detached
            free, handle = args[0], args[1]
            free(handle)

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"handle={self._h:#x}"
        return f"<kvbmgo.{type(self).__name__} {state}>"


def _ptr(obj: Any, kind: type, what: str) -> Optional[int]:
    """A Stream/Event (or a raw driver handle as an int, or None) as a pointer."""
    if obj is None:
        return None
    if isinstance(obj, kind):
        return obj.handle
    if isinstance(obj, int):
        return obj
    raise TypeError(f"{what}: expected {kind.__name__}, an int driver handle or None, "
                    f"got {type(obj).__name__}")


# --------------------------------------------------------- streams, events


class Stream(_Handle):
    """A non-blocking device stream made by kvbm (works under every backend)."""

    __slots__ = ()
    _kind = "Stream"

    def __init__(self, device: int = 0) -> None:
        """Creates a stream on device. Raises CudaError."""
        h = c_void_p()
        lib.kvbm_stream_create(device, byref(h))
        self._own(h.value, lib.kvbm_stream_destroy)

    def synchronize(self) -> None:
        """Blocks (GIL released) until the work queued on the stream is done.
        Raises CudaError if it failed."""
        lib.kvbm_stream_synchronize(self.handle)

    def wait_event(self, event: "Union[Event, int]") -> None:
        """Makes work queued on this stream after the call wait for event's
        capture. Raises CudaError."""
        lib.kvbm_stream_wait_event(self.handle, _ptr(event, Event, "event"))


class Event(_Handle):
    """A device event made by kvbm (timing disabled). An engine's own event
    can be passed instead as an int (e.g. ``torch.cuda.Event().cuda_event``)."""

    __slots__ = ()
    _kind = "Event"

    def __init__(self, device: int = 0) -> None:
        """Creates an event on device. Raises CudaError."""
        h = c_void_p()
        lib.kvbm_event_create(device, byref(h))
        self._own(h.value, lib.kvbm_event_destroy)

    def record(self, stream: "Union[Stream, int, None]" = None) -> None:
        """Captures the work queued on stream so far (None: the legacy default
        stream). Raises CudaError."""
        lib.kvbm_event_record(self.handle, _ptr(stream, Stream, "stream"))

    def query(self) -> bool:
        """True when the captured work is done (or never recorded), False while
        pending. Raises CudaError if the work failed."""
        return lib.kvbm_event_query(self.handle) == KVBM_OK

    def synchronize(self) -> None:
        """Blocks (GIL released) until the captured work is done. Raises CudaError."""
        lib.kvbm_event_synchronize(self.handle)


# ------------------------------------------------------------ notification


class Notification(_Handle):
    """Tracks one transfer. Returned by Worker transfers; close it when done
    (or use ``with``); a transfer still running goes on after close().

    ``await notification`` waits without blocking the event loop.
    """

    __slots__ = ()
    _kind = "Notification"

    def __init__(self, handle: int) -> None:
        self._own(handle, lib.kvbm_notification_free)

    def poll(self) -> bool:
        """True when the transfer completed successfully, False while it runs.
        Raises the transfer's error (CudaError, KvbmIOError,
        DataCorruptionError, ...; see failed_blocks()), InvalidHandleError."""
        return lib.kvbm_notification_poll(self.handle) == KVBM_OK

    def done(self) -> bool:
        """True once the transfer finished, successfully or not (as
        ``Future.done()``); never raises the transfer's error (poll(), wait()
        or failed_blocks() tell how it went). Raises KvbmClosedError after
        close(), InvalidHandleError."""
        h = self.handle  # KvbmClosedError after close()
        try:
            return lib.kvbm_notification_poll(h) == KVBM_OK
        except (InvalidHandleError, FailedPreconditionError):
            raise  # about the handle or the process, not the transfer
        except KvbmError:
            return True  # finished, with the transfer's error

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks (GIL released) until the transfer completes or timeout seconds
        pass (None or math.inf: forever). True when it completed successfully,
        False on a timeout (the transfer goes on; wait again). Raises the
        transfer's error; ValueError for a NaN timeout."""
        ms = _timeout_ms(timeout)
        h = self.handle
        try:
            lib.kvbm_notification_wait(h, ms)
        except KvbmTimeoutError:
            # The library may report a timeout for a transfer that finished
            # as the time ran out (with 0 ms, even long after): ask once more.
            return lib.kvbm_notification_poll(h) == KVBM_OK
        return True

    async def wait_async(self, timeout: Optional[float] = None) -> bool:
        """As wait(), for asyncio: polls with a growing asyncio.sleep (50 µs up
        to 5 ms), never blocking the event loop; cancellation-safe."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = 50e-6
        while not self.poll():
            if deadline is not None and loop.time() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5e-3)
        return True

    def __await__(self) -> Generator[Any, None, bool]:
        return self.wait_async().__await__()

    def failed_blocks(self) -> List[int]:
        """The destination block ids whose data is not valid (sorted; empty while
        pending or on success)."""
        h = self.handle
        n = c_size_t()
        buf = (ctypes.c_uint32 * 0)()
        while True:
            try:
                lib.kvbm_notification_failed_blocks(h, buf if len(buf) else None, len(buf),
                                                    byref(n))
                return list(buf[:n.value])
            except BufferTooSmallError:
                buf = (ctypes.c_uint32 * n.value)()


def _timeout_ms(timeout: Optional[float]) -> int:
    """Seconds as kvbm_notification_wait's milliseconds: -1 (forever) for None,
    infinity or more than an int64 of milliseconds; 0 for a negative timeout."""
    if timeout is None:
        return -1
    timeout = float(timeout)
    if math.isnan(timeout):
        raise ValueError("wait: timeout is NaN")
    if timeout <= 0:
        return 0
    if math.isinf(timeout) or timeout * 1000 >= 2**63 - 1:
        return -1
    return int(timeout * 1000)


# ------------------------------------------------------------------ worker


def _options(layers: Optional[Tuple[int, int]], stream: Any,
             precondition: Any) -> Optional[_lib.TransferOptionsC]:
    if layers is None and stream is None and precondition is None:
        return None
    o = _lib.TransferOptionsC()
    o.struct_size = sizeof(o)
    if layers is not None:
        o.layer_start, o.layer_end = layers
    o.stream = _ptr(stream, Stream, "stream")
    o.precondition = _ptr(precondition, Event, "precondition")
    return o


def _same_len(src: Tuple[Any, int], dst: Tuple[Any, int]) -> int:
    if src[1] != dst[1]:
        raise ValueError(f"src_ids has {src[1]} ids, dst_ids {dst[1]}: they must be as long")
    return src[1]


def _keys(keys: Iterable[Key]) -> Tuple[Any, Any, int]:
    raw = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
    n = len(raw)
    return (c_char_p * n)(*raw), (c_size_t * n)(*map(len, raw)), n


def _bytes(md: Union[bytes, bytearray, memoryview]) -> Tuple[Any, int]:
    b = bytes(md)
    return b, len(b)


#: worker_id -> the live Worker of this process with that id, so that an
#: import of bytes metadata can keep the exporter's G1 memory alive.
_workers: "weakref.WeakValueDictionary[int, Worker]" = weakref.WeakValueDictionary()

#: G1 memory of workers whose destroy failed: the library may still use it,
#: so it is kept for the life of the process.
_stranded: List[Any] = []

_MD_HEADER = struct.Struct("<4sHHQ")  # magic "KVBM", version, layout count, worker id


def _exporter_id(md: bytes) -> Optional[int]:
    """The exporting worker's id in metadata bytes (core/worker/metadata.go:
    magic "KVBM" | version u16 | count u16 | worker u64, little endian), or
    None for bytes of another form (the library then rejects them)."""
    if len(md) < _MD_HEADER.size:
        return None
    magic, ver, _, wid = _MD_HEADER.unpack_from(md)
    return wid if magic == b"KVBM" and ver == 1 else None


class Worker(_Handle):
    """A worker with its own transfer manager on the active device backend.

    It keeps the memory registered as G1 alive until it is closed (or
    collected). Safe to use from many threads at once.
    """

    __slots__ = ("worker_id", "device_id", "_g1", "_remotes", "_dependents")
    _kind = "Worker"

    def __init__(self, worker_id: int, *, device_id: int = 0, rank: int = 0,
                 disk_dir: Union[str, "PathLike[str]", None] = None,
                 object_dir: Union[str, "PathLike[str]", None] = None) -> None:
        """Creates a worker on device device_id of the active backend.
        worker_id must be unique among the live workers of the process;
        disk_dir enables G3, object_dir the G4 object store. Raises
        AlreadyExistsError (worker_id in use), KvbmIOError (object_dir),
        UnsupportedError / CudaError (device backend)."""
        c = _lib.WorkerConfigC()
        c.struct_size = sizeof(c)
        c.device_id, c.rank, c.worker_id = device_id, rank, worker_id
        c.disk_dir = fspath(disk_dir).encode() if disk_dir is not None else None
        c.object_dir = fspath(object_dir).encode() if object_dir is not None else None
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
        self._dependents: "weakref.WeakSet[CoordinatedWorker]" = weakref.WeakSet()
        # The lists travel with the finalizer: the memory outlives the destroy.
        self._own(h.value, lib.kvbm_worker_destroy, self._g1, self._remotes)
        _workers[worker_id] = self

    def close(self) -> None:
        """Closes the coordinated workers over this one, waits for transfers in
        flight, releases G2/G3, then lets go of the registered G1 memory (which
        workers that imported this one's layouts keep alive until they close).
        Raises the first error of a failed destroy, after closing everything:
        G1 memory of a worker whose destroy failed is then kept for good."""
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
        if not isinstance(buffers, (list, tuple)):
            buffers = [buffers]
        separate = config.layout_kind == LayoutKind.LAYER_SEPARATE
        want_n = config.num_layers if separate else 1
        if len(buffers) != want_n:
            raise ValueError(f"register_g1: {len(buffers)} buffers for a "
                             f"{'layer_separate' if separate else 'fully_contiguous'} layout "
                             f"that needs {want_n}")
        want_bytes = config.layer_bytes if separate else config.total_bytes
        descs = []
        for i, b in enumerate(buffers):
            d = buffer_of(b, f"register_g1 buffer {i}")
            if d.itemsize != config.dtype_width:
                raise TypeError(f"register_g1 buffer {i}: element size {d.itemsize} != "
                                f"dtype_width {config.dtype_width}")
            if d.nbytes != want_bytes:
                raise ValueError(f"register_g1 buffer {i}: {d.nbytes} bytes, the layout needs "
                                 f"{want_bytes}")
            descs.append(d)
        backend = _backend()
        for i, d in enumerate(descs):
            if d.device is None:
                if backend == "cuda":
                    raise TypeError("register_g1: host memory cannot be G1 under the cuda "
                                    "backend; pass CUDA tensors")
            elif backend != "cuda":
                raise TypeError(f"register_g1 buffer {i}: a CUDA tensor (cuda:{d.device}) "
                                f"under the {backend} backend, which takes host memory")
            elif d.device != self.device_id:
                raise ValueError(f"register_g1 buffer {i}: a tensor on cuda:{d.device}, "
                                 f"the worker is on device {self.device_id}")
        ptrs = (ctypes.c_uint64 * len(descs))(*(d.address for d in descs))
        out = _lib.LayoutHandleC()
        cfg = config.to_c()
        lib.kvbm_worker_register_g1(h, byref(cfg), ptrs, len(descs), byref(out))
        self._g1.extend(d.owner for d in descs)
        return _handle(out)

    def register_kv_caches(self, kv_caches: Union[Mapping[str, Any], Sequence[Any]], *,
                           page_size: Optional[int] = None,
                           layout: Union[str, int] = "layer_separate",
                           block_dim: Union[str, int] = "second"
                           ) -> Tuple[LayoutConfig, LayoutHandle]:
        """LayoutConfig.from_kv_caches, then register_g1 with those tensors.
        Returns the inferred config (e.g. to allocate G2 alike) and the handle."""
        cfg = LayoutConfig.from_kv_caches(kv_caches, page_size=page_size, layout=layout,
                                          block_dim=block_dim)
        tensors = list(kv_caches.values()) if isinstance(kv_caches, Mapping) else list(kv_caches)
        return cfg, self.register_g1(cfg, tensors)

    def allocate_g2(self, config: LayoutConfig) -> LayoutHandle:
        """Allocates G2 (pinned host memory, owned by the worker). Raises
        AlreadyExistsError, CudaError, InvalidArgumentError."""
        out = _lib.LayoutHandleC()
        cfg = config.to_c()
        lib.kvbm_worker_allocate_g2(self.handle, byref(cfg), byref(out))
        return _handle(out)

    def allocate_g3(self, config: LayoutConfig) -> LayoutHandle:
        """Allocates G3 (a file in disk_dir). Raises InvalidArgumentError (no
        disk_dir), AlreadyExistsError, KvbmIOError."""
        out = _lib.LayoutHandleC()
        cfg = config.to_c()
        lib.kvbm_worker_allocate_g3(self.handle, byref(cfg), byref(out))
        return _handle(out)

    # ---- transfers

    def transfer(self, src: int, src_ids: Ids, dst: int, dst_ids: Ids, *,
                 layers: Optional[Tuple[int, int]] = None,
                 stream: "Union[Stream, int, None]" = None,
                 precondition: "Union[Event, int, None]" = None) -> Notification:
        """Copies blocks src_ids of tier src into blocks dst_ids of tier dst.
        layers is a half-open range (start, end); precondition an event the copy
        waits for before it reads. Returns the Notification (close it).
        Raises ValueError (lengths differ), InvalidArgumentError (ids out of
        range or repeated), NotFoundError (tier not registered),
        UnsupportedError, CudaError, CanceledError."""
        s, d = block_ids(src_ids, "src_ids"), block_ids(dst_ids, "dst_ids")
        n = _same_len(s, d)
        opts = _options(layers, stream, precondition)
        out = c_void_p()
        lib.kvbm_worker_transfer(self.handle, src, s[0], dst, d[0], n,
                                 byref(opts) if opts is not None else None, byref(out))
        return Notification(out.value)

    def onboard_layerwise(self, src_ids: Ids, dst_ids: Ids, events: "Sequence[Union[Event, int]]",
                          stream: "Union[Stream, int, None]" = None) -> Notification:
        """Onboards G2 -> G1 one layer at a time, recording events[L] right
        after layer L's copies (one event per layer). Raises as transfer()."""
        s, d = block_ids(src_ids, "src_ids"), block_ids(dst_ids, "dst_ids")
        n = _same_len(s, d)
        ev = (c_void_p * len(events))(*(_ptr(e, Event, "events") for e in events))
        out = c_void_p()
        lib.kvbm_worker_onboard_layerwise(self.handle, s[0], d[0], n, ev, len(events),
                                          _ptr(stream, Stream, "stream"), byref(out))
        return Notification(out.value)

    # ---- metadata and remotes

    def export_metadata(self) -> bytes:
        """The worker's layout metadata (every registered tier), for another
        worker's import_metadata / connect_remote."""
        h = self.handle
        size = c_size_t()
        try:
            lib.kvbm_worker_export_metadata(h, None, 0, byref(size))
        except BufferTooSmallError:
            pass
        while True:
            buf = (c_uint8 * size.value)()
            try:
                lib.kvbm_worker_export_metadata(h, buf, size.value, byref(size))
                return bytes(buf[:size.value])
            except BufferTooSmallError:
                continue

    def _metadata(self, source: "Union[bytes, Worker]") -> Tuple[Any, int]:
        if isinstance(source, Worker):
            self._remotes.append(source)  # the exporter must outlive our use
            b = _bytes(source.export_metadata())
        else:
            b = _bytes(source)
        self._pin_exporter(b[0])
        return b

    def _pin_exporter(self, md: bytes) -> None:
        """Keeps the G1 memory of md's exporter (a live Worker of this process)
        alive while this worker lives, even past the exporter's close(): a
        transfer of ours may still read or write it."""
        wid = _exporter_id(md)
        exporter = _workers.get(wid) if wid is not None else None
        if exporter is not None and exporter is not self and not exporter.closed:
            g1 = exporter._g1
            if not any(r is g1 for r in self._remotes):
                self._remotes.append(g1)

    def import_metadata(self, source: "Union[bytes, Worker]") -> None:
        """Imports another in-process worker's metadata (bytes, or the Worker
        itself, which is then kept alive) so its layouts can be sources.
        Raises InvalidArgumentError (own metadata), DataCorruptionError,
        NotFoundError (the exporter is gone)."""
        b, n = self._metadata(source)
        lib.kvbm_worker_import_metadata(self.handle, b, n)

    def connect_remote(self, instance: int, source: "Union[bytes, Worker]") -> None:
        """As import_metadata, remembering the layouts under instance for
        transfer_from_instance."""
        b, n = self._metadata(source)
        lib.kvbm_worker_connect_remote(self.handle, instance, b, n)

    def transfer_from_instance(self, instance: int, src: int, src_ids: Ids, dst: int,
                               dst_ids: Ids, *, layers: Optional[Tuple[int, int]] = None,
                               stream: "Union[Stream, int, None]" = None,
                               precondition: "Union[Event, int, None]" = None) -> Notification:
        """Pulls blocks of a connected instance's tier src into local tier dst.
        Raises as transfer(), NotFoundError for an unknown instance or tier."""
        s, d = block_ids(src_ids, "src_ids"), block_ids(dst_ids, "dst_ids")
        n = _same_len(s, d)
        opts = _options(layers, stream, precondition)
        out = c_void_p()
        lib.kvbm_worker_transfer_from_instance(self.handle, instance, src, s[0], dst, d[0], n,
                                               byref(opts) if opts is not None else None,
                                               byref(out))
        return Notification(out.value)

    def transfer_from_remote(self, remote: LayoutHandle, src_ids: Ids, dst: int, dst_ids: Ids,
                             *, layers: Optional[Tuple[int, int]] = None,
                             stream: "Union[Stream, int, None]" = None,
                             precondition: "Union[Event, int, None]" = None) -> Notification:
        """Pulls blocks src_ids of another worker's layout remote (imported with
        import_metadata) into local tier dst. Raises as transfer(),
        NotFoundError when remote was not imported."""
        s, d = block_ids(src_ids, "src_ids"), block_ids(dst_ids, "dst_ids")
        n = _same_len(s, d)
        opts = _options(layers, stream, precondition)
        r, out = remote.to_c(), c_void_p()
        lib.kvbm_worker_transfer_from_remote(self.handle, byref(r), s[0], dst, d[0], n,
                                             byref(opts) if opts is not None else None,
                                             byref(out))
        return Notification(out.value)

    def transfer_to_remote(self, src: int, src_ids: Ids, remote: LayoutHandle, dst_ids: Ids,
                           *, layers: Optional[Tuple[int, int]] = None,
                           stream: "Union[Stream, int, None]" = None,
                           precondition: "Union[Event, int, None]" = None) -> Notification:
        """Pushes blocks src_ids of local tier src into blocks dst_ids of another
        worker's imported layout remote (offload to a peer). Raises as
        transfer_from_remote()."""
        s, d = block_ids(src_ids, "src_ids"), block_ids(dst_ids, "dst_ids")
        n = _same_len(s, d)
        opts = _options(layers, stream, precondition)
        r, out = remote.to_c(), c_void_p()
        lib.kvbm_worker_transfer_to_remote(self.handle, src, s[0], byref(r), d[0], n,
                                           byref(opts) if opts is not None else None,
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

    # ---- object store (G4)

    def object_has(self, keys: Sequence[Key]) -> List[bool]:
        """Whether a well-formed object exists under each key (1 to 64 bytes;
        str is UTF-8 encoded). Raises InvalidArgumentError for a bad key."""
        k, lens, n = _keys(keys)
        found = (c_uint8 * n)()
        lib.kvbm_worker_object_has(self.handle, k, lens, n, found)
        return [bool(f) for f in found]

    def _object_io(self, fn: Any, keys: Sequence[Key], tier: int, ids: Ids) -> List[int]:
        k, lens, n = _keys(keys)
        b = block_ids(ids, "block_ids")
        if b[1] != n:
            raise ValueError(f"{n} keys for {b[1]} block ids: they must be as long")
        statuses = (c_int32 * n)()
        try:
            fn(self.handle, k, lens, n, tier, b[0], statuses)
        except KvbmError as e:
            e.block_statuses = list(statuses)  # type: ignore[attr-defined]
            raise
        return list(statuses)

    def object_put(self, keys: Sequence[Key], tier: int, block_ids: Ids) -> None:
        """Stores blocks block_ids of tier under keys (blocking, GIL released).
        Raises the first failed block's error (UnsupportedError without an
        object store, KvbmIOError, ...) with ``block_statuses`` (one status per
        block) attached."""
        self._object_io(lib.kvbm_worker_object_put, keys, tier, block_ids)

    def object_get(self, keys: Sequence[Key], tier: int, block_ids: Ids) -> None:
        """Loads the objects under keys into blocks block_ids of tier. Raises
        as object_put; NotFoundError for a missing object,
        DataCorruptionError for a corrupt one."""
        self._object_io(lib.kvbm_worker_object_get, keys, tier, block_ids)


    def onboard_objects(self, keys: Sequence[Key], dst: int, dst_ids: Ids) -> Notification:
        """As object_get, in the background: returns at once with a Notification
        whose failure lists the destination blocks whose objects failed.
        Raises ValueError (lengths differ), InvalidArgumentError, NotFoundError
        (tier not registered), UnsupportedError (no object store)."""
        k, lens, n = _keys(keys)
        b = block_ids(dst_ids, "dst_ids")
        if b[1] != n:
            raise ValueError(f"{n} keys for {b[1]} block ids: they must be as long")
        out = c_void_p()
        lib.kvbm_worker_onboard_objects(self.handle, k, lens, n, dst, b[0], byref(out))
        return Notification(out.value)

    def offload_objects(self, src: int, src_ids: Ids, keys: Sequence[Key]) -> Notification:
        """As object_put, in the background: returns at once with a Notification
        whose failure lists the source blocks whose objects failed. Raises as
        onboard_objects()."""
        k, lens, n = _keys(keys)
        b = block_ids(src_ids, "src_ids")
        if b[1] != n:
            raise ValueError(f"{n} keys for {b[1]} block ids: they must be as long")
        out = c_void_p()
        lib.kvbm_worker_offload_objects(self.handle, src, b[0], k, lens, n, byref(out))
        return Notification(out.value)


class TransferPath(enum.IntEnum):
    """KVBM_PATH_*: the paths blocks move along (keys of Worker.counters())."""
    HOST_COPY = 0   # host <-> host memcpy
    H2D = 1         # pinned -> device (layer-wise onboard too)
    D2H = 2         # device -> pinned
    D2D = 3         # device -> device
    DISK_WRITE = 4  # host -> disk
    DISK_READ = 5   # disk -> host
    TWO_HOP = 6     # disk <-> device, disk <-> disk via a bounce buffer


class PathCounters(NamedTuple):
    """Totals of one path since the worker was created."""
    transfers: int      # completed transfers, failed or not
    blocks: int         # blocks those transfers moved or tried to
    bytes: int
    failed_blocks: int  # destination blocks reported failed
    nanoseconds: int    # time in flight, call to completion, summed


_backend_name: Optional[str] = None


def _backend() -> str:
    global _backend_name
    if _backend_name is None:
        _backend_name = info().device_backend
    return _backend_name


# ------------------------------------------------------- coordinated worker


class CoordinatedWorker(_Handle):
    """The leader's view of a worker: its own tier handles and those of remote
    workers by (leader instance, rank). Closed automatically, first, when its
    inner Worker is closed."""

    __slots__ = ("worker",)
    _kind = "CoordinatedWorker"

    def __init__(self, worker: Worker, rank: int, host_instance: int) -> None:
        """Creates one over worker (kept alive while this lives)."""
        h = c_void_p()
        lib.kvbm_coordinated_create(worker.handle, rank, host_instance, byref(h))
        self.worker = worker
        self._own(h.value, lib.kvbm_coordinated_destroy, worker)
        worker._dependents.add(self)

    def set_local(self, tier: int, handle: LayoutHandle) -> None:
        """Records the handle of a local tier. Raises AlreadyExistsError,
        InvalidArgumentError."""
        c = handle.to_c()
        lib.kvbm_coordinated_set_local(self.handle, tier, byref(c))

    def apply_layout_response(self, metadata: bytes) -> None:
        """Records the local handles named in metadata the inner worker
        exported. Raises DataCorruptionError, AlreadyExistsError."""
        b, n = _bytes(metadata)
        lib.kvbm_coordinated_apply_layout_response(self.handle, b, n)

    def import_remote_metadata(self, leader: int, rank: int, metadata: bytes) -> None:
        """Imports worker rank of remote leader's metadata and records its
        handles. Raises as Worker.import_metadata."""
        b, n = _bytes(metadata)
        self.worker._pin_exporter(b)
        lib.kvbm_coordinated_import_remote_metadata(self.handle, leader, rank, b, n)

    def resolve_remote_handle(self, leader: int, rank: int, tier: int) -> LayoutHandle:
        """The handle of tier of remote (leader, rank). Raises NotFoundError."""
        out = _lib.LayoutHandleC()
        lib.kvbm_coordinated_resolve_remote_handle(self.handle, leader, rank, tier, byref(out))
        return _handle(out)

    def transfer_from_remote(self, leader: int, rank: int, src: int, src_ids: Ids, dst: int,
                             dst_ids: Ids, *, layers: Optional[Tuple[int, int]] = None,
                             stream: "Union[Stream, int, None]" = None,
                             precondition: "Union[Event, int, None]" = None) -> Notification:
        """Pulls blocks of remote (leader, rank) tier src into local tier dst.
        Raises as Worker.transfer, NotFoundError for an unknown remote or tier."""
        s, d = block_ids(src_ids, "src_ids"), block_ids(dst_ids, "dst_ids")
        n = _same_len(s, d)
        opts = _options(layers, stream, precondition)
        out = c_void_p()
        lib.kvbm_coordinated_transfer_from_remote(self.handle, leader, rank, src, s[0], dst,
                                                  d[0], n,
                                                  byref(opts) if opts is not None else None,
                                                  byref(out))
        return Notification(out.value)


# ----------------------------------------------------------------- handoff


class HandoffOrder(enum.IntEnum):
    SOURCE_FIRST = 1       # vLLM
    DESTINATION_FIRST = 2  # SGLang


class FactKind(enum.IntEnum):
    SOURCE_HELD = 1
    DESTINATION_RESERVED = 2
    TRANSFER_COMPLETED = 3
    FAILED = 4
    TIMED_OUT = 5
    CANCELED = 6


class TimingMode(enum.IntEnum):
    FULL_PROMPT = 1
    DESTINATION_MISSING = 2


class ActionKind(enum.IntEnum):
    SUBMIT_PREFILL = 1        # report SUBMITTED or FAILED
    RESERVE_DESTINATION = 2   # report ACCEPTED or FAILED
    START_TRANSFER = 3        # report SCHEDULED or FAILED
    ACTIVATE_DESTINATION = 4  # report APPLIED or FAILED
    RELEASE_SOURCE = 5        # report APPLIED, NOOP or FAILED
    CANCEL_SOURCE = 6         # report APPLIED or NOOP
    CANCEL_DESTINATION = 7    # report APPLIED or NOOP
    COMPLETE = 8              # over; see completion


class OutcomeKind(enum.IntEnum):
    SUBMITTED = 1
    ACCEPTED = 2
    SCHEDULED = 3
    APPLIED = 4
    NOOP = 5
    FAILED = 6


class Completion(enum.IntEnum):
    NONE = 0
    SUCCESS = 1
    CANCELED = 2


class Action(NamedTuple):
    """An action for the driver; report its outcome under ``id``."""
    id: int
    kind: ActionKind
    completion: Completion
    delay_ms: float
    handoff_id: bytes


def _handoff_id(hid: Union[bytes, bytearray, uuid.UUID]) -> bytes:
    b = hid.bytes if isinstance(hid, uuid.UUID) else bytes(hid)
    if len(b) != 16:
        raise ValueError(f"a hand-off id is 16 bytes, got {len(b)}")
    return b


class HandoffCoordinator(_Handle):
    """One prefill -> decode hand-off as a pure state machine: facts and action
    outcomes in, actions (lists of Action) out. Calls are serialised by the
    library; the driver decides their order."""

    __slots__ = ("id",)
    _kind = "HandoffCoordinator"

    def __init__(self, handoff_id: Union[bytes, uuid.UUID], order: int,
                 fallback_delay_ms: float = 0.0) -> None:
        """Creates the coordinator of handoff_id (16 bytes or a UUID) in order;
        fallback_delay_ms is the START_TRANSFER delay when the timing gives
        none. Raises ValueError (id length), InvalidArgumentError (order,
        delay)."""
        self.id = _handoff_id(handoff_id)
        h = c_void_p()
        lib.kvbm_handoff_new(self.id, order, fallback_delay_ms, byref(h))
        self._own(h.value, lib.kvbm_handoff_free)

    @staticmethod
    def _actions(acts: Any, n: int) -> List[Action]:
        return [Action(a.id, ActionKind(a.kind), Completion(a.completion), a.delay_ms,
                       bytes(a.handoff_id)) for a in acts[:n]]

    def start(self) -> List[Action]:
        """Starts the hand-off; returns the actions to execute, in order."""
        acts, n = _lib.ActionArray(), c_size_t()
        lib.kvbm_handoff_start(self.handle, acts, KVBM_HANDOFF_MAX_ACTIONS, byref(n))
        return self._actions(acts, n.value)

    def on_fact(self, kind: int, *, timing_mode: int = TimingMode.FULL_PROMPT,
                full_prompt_tokens: int = 0, kv_bytes_per_token: Optional[int] = None,
                bandwidth_gbs: Optional[float] = None,
                transferable_tokens: int = 0) -> List[Action]:
        """Applies a fact (timing_* fields are read for SOURCE_HELD,
        transferable_tokens for DESTINATION_RESERVED); returns the actions.
        Raises InvalidArgumentError (unknown kind, invalid timing),
        FailedPreconditionError (a fact out of order)."""
        f = _lib.HandoffFactC()
        f.struct_size = sizeof(f)
        f.kind, f.timing_mode = kind, timing_mode
        f.handoff_id[:] = self.id
        f.full_prompt_tokens, f.transferable_tokens = full_prompt_tokens, transferable_tokens
        if kv_bytes_per_token is not None:
            f.kv_bytes_per_token, f.has_kv_bytes_per_token = kv_bytes_per_token, 1
        if bandwidth_gbs is not None:
            f.bandwidth_gbs, f.has_bandwidth_gbs = bandwidth_gbs, 1
        acts, n = _lib.ActionArray(), c_size_t()
        lib.kvbm_handoff_on_fact(self.handle, byref(f), acts, KVBM_HANDOFF_MAX_ACTIONS, byref(n))
        return self._actions(acts, n.value)

    def on_outcome(self, action_id: int, outcome: int,
                   message: Optional[str] = None) -> List[Action]:
        """Reports how action action_id went (message: why it FAILED); returns
        the actions. Raises NotFoundError (no such action), AlreadyExistsError
        (a different outcome reported), InvalidArgumentError (an outcome the
        action does not take), FailedPreconditionError (a cancel reported
        FAILED: retry it)."""
        acts, n = _lib.ActionArray(), c_size_t()
        lib.kvbm_handoff_on_outcome(self.handle, action_id, outcome,
                                    message.encode() if message is not None else None,
                                    acts, KVBM_HANDOFF_MAX_ACTIONS, byref(n))
        return self._actions(acts, n.value)

    def is_complete(self) -> bool:
        """True once a COMPLETE action was issued."""
        v = c_int32()
        lib.kvbm_handoff_is_complete(self.handle, byref(v))
        return bool(v.value)

    def completion(self) -> Completion:
        """How the hand-off ended (Completion.NONE while not)."""
        v = c_int32()
        lib.kvbm_handoff_completion(self.handle, byref(v))
        return Completion(v.value)
