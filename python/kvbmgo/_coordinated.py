"""The leader's view of a worker: its tiers and those of remote workers."""

from __future__ import annotations

from ctypes import byref, c_void_p
from typing import Optional, Tuple, Union

from . import _lib
from ._cint import Ids, int32, metadata_bytes, transfer_ids, uint64
from ._device import Event, Stream
from ._handle import Handle
from ._layout import LayoutHandle, handle_of
from ._lib import lib
from ._notification import Notification
from ._options import options
from ._worker import Worker

__all__ = ["CoordinatedWorker"]


class CoordinatedWorker(Handle):
    """The leader's view of a worker: its own tier handles and those of remote
    workers by (leader instance, rank). Closed automatically, first, when its
    inner Worker is closed."""

    __slots__ = ("worker",)
    _kind = "CoordinatedWorker"

    def __init__(self, worker: Worker, rank: int, host_instance: int) -> None:
        """Creates one over worker (kept alive while this lives). Raises
        InvalidArgumentError (rank does not fit an int32, host_instance a
        uint64), TypeError."""
        rank, host_instance = int32(rank, "rank"), uint64(host_instance, "host_instance")
        h = c_void_p()
        lib.kvbm_coordinated_create(worker.handle, rank, host_instance, byref(h))
        self.worker = worker
        self._own(h.value, lib.kvbm_coordinated_destroy, worker)
        worker._dependents.add(self)

    def set_local(self, tier: int, handle: LayoutHandle) -> None:
        """Records the handle of a local tier. Raises AlreadyExistsError (the
        tier is set already), InvalidArgumentError (a bad tier or handle; one
        that does not fit its C type), TypeError."""
        tier = int32(tier, "tier")
        c = LayoutHandle(*handle).to_c("handle")
        lib.kvbm_coordinated_set_local(self.handle, tier, byref(c))

    def apply_layout_response(self, metadata: bytes) -> None:
        """Records the local handles named in metadata the inner worker
        exported. Raises InvalidArgumentError (empty metadata),
        DataCorruptionError (bytes that do not decode), AlreadyExistsError (a
        tier set to another handle; nothing applied)."""
        b, n = metadata_bytes(metadata)
        lib.kvbm_coordinated_apply_layout_response(self.handle, b, n)

    def import_remote_metadata(self, leader: int, rank: int, metadata: bytes) -> None:
        """Imports worker rank of remote leader's metadata and records its
        handles. Raises as Worker.import_metadata."""
        leader, rank = uint64(leader, "leader"), int32(rank, "rank")
        b, n = metadata_bytes(metadata)
        self.worker._pin_exporter(b)
        lib.kvbm_coordinated_import_remote_metadata(self.handle, leader, rank, b, n)

    def resolve_remote_handle(self, leader: int, rank: int, tier: int) -> LayoutHandle:
        """The handle of tier of remote (leader, rank). Raises NotFoundError
        (an unknown remote or tier), InvalidArgumentError (a bad tier; an
        integer that does not fit its C type), TypeError."""
        out = _lib.LayoutHandleC()
        lib.kvbm_coordinated_resolve_remote_handle(self.handle, uint64(leader, "leader"),
                                                   int32(rank, "rank"), int32(tier, "tier"),
                                                   byref(out))
        return handle_of(out)

    def transfer_from_remote(self, leader: int, rank: int, src: int, src_ids: Ids, dst: int,
                             dst_ids: Ids, *, layers: Optional[Tuple[int, int]] = None,
                             stream: "Union[Stream, int, None]" = None,
                             precondition: "Union[Event, int, None]" = None) -> Notification:
        """Pulls blocks of remote (leader, rank) tier src into local tier dst.
        Raises as Worker.transfer, NotFoundError for an unknown remote or tier."""
        s, sa, d, da, n = transfer_ids(src_ids, dst_ids)
        out = c_void_p()
        lib.kvbm_coordinated_transfer_from_remote(self.handle, uint64(leader, "leader"),
                                                  int32(rank, "rank"), int32(src, "src"), sa,
                                                  int32(dst, "dst"), da, n,
                                                  options(layers, stream, precondition),
                                                  byref(out))
        return Notification(out.value)
