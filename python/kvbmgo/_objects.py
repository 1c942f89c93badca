"""A worker's G4 operations (its object store): whether objects exist,
and blocks stored under keys and loaded back, blocking or in the
background. Worker inherits them (ObjectOps needs its handle)."""

from __future__ import annotations

from ctypes import byref, c_int32, c_uint8, c_void_p
from typing import Any, List, Sequence, Union

from ._cint import Ids, block_ids, int32
from ._cint import keys as _keys
from ._lib import lib
from ._notification import Notification
from .errors import KvbmError

__all__ = ["Key", "ObjectOps"]

Key = Union[bytes, bytearray, str]


class ObjectOps:
    """The object-store operations of Worker (handle: the worker's)."""

    handle: Any

    def object_has(self, keys: Sequence[Key]) -> List[bool]:
        """Whether a well-formed object exists under each key (1 to 64 bytes;
        str is UTF-8 encoded). Raises InvalidArgumentError for a bad key
        (empty or longer than 64 bytes). Without an object store nothing is
        found."""
        k, lens, n = _keys(keys)
        found = (c_uint8 * n)()
        lib.kvbm_worker_object_has(self.handle, k, lens, n, found)
        return [bool(f) for f in found]

    def _object_io(self, fn: Any, keys: Sequence[Key], tier: int, ids: Ids) -> List[int]:
        k, lens, n = _keys(keys)
        tier = int32(tier, "tier")
        b, ba, m = block_ids(ids, "block_ids")
        if m != n:
            raise ValueError(f"{n} keys for {m} block ids: they must be as long")
        statuses = (c_int32 * n)()
        try:
            fn(self.handle, k, lens, n, tier, ba, statuses)
        except KvbmError as e:
            e.block_statuses = list(statuses)  # type: ignore[attr-defined]
            raise
        return list(statuses)

    def object_put(self, keys: Sequence[Key], tier: int, block_ids: Ids) -> None:
        """Stores blocks block_ids of tier under keys (blocking, GIL released).
        Before anything moves, raises ValueError (lengths differ),
        OutOfRangeError (an id beyond the layout), InvalidArgumentError (a
        bad key, a tier outside G1..G3, an integer that does not fit its C
        type), TypeError, NotFoundError (tier not registered),
        UnsupportedError (no object store). Then raises the first failed
        block's error (KvbmIOError, KvbmTimeoutError, ...) with
        ``block_statuses`` (one status per block) attached."""
        self._object_io(lib.kvbm_worker_object_put, keys, tier, block_ids)

    def object_get(self, keys: Sequence[Key], tier: int, block_ids: Ids) -> None:
        """Loads the objects under keys into blocks block_ids of tier. Raises
        as object_put; NotFoundError for a missing object,
        DataCorruptionError for a corrupt one, whose block may then hold any
        bytes (it is read in place, checked as it lands) but is never
        reported loaded."""
        self._object_io(lib.kvbm_worker_object_get, keys, tier, block_ids)

    def onboard_objects(self, keys: Sequence[Key], dst: int, dst_ids: Ids) -> Notification:
        """As object_get, in the background: returns at once with a Notification
        whose failure lists the destination blocks whose objects failed.
        Raises ValueError (lengths differ), OutOfRangeError (an id beyond the
        layout), InvalidArgumentError (a destination repeated, a bad key, a
        tier outside G1..G3, an integer that does not fit its C type),
        TypeError, NotFoundError (tier not registered), UnsupportedError (no
        object store)."""
        k, lens, n = _keys(keys)
        dst = int32(dst, "dst")
        b, ba, m = block_ids(dst_ids, "dst_ids")
        if m != n:
            raise ValueError(f"{n} keys for {m} block ids: they must be as long")
        out = c_void_p()
        lib.kvbm_worker_onboard_objects(self.handle, k, lens, n, dst, ba, byref(out))
        return Notification(out.value)

    def offload_objects(self, src: int, src_ids: Ids, keys: Sequence[Key]) -> Notification:
        """As object_put, in the background: returns at once with a Notification
        whose failure lists the source blocks whose objects failed. Raises as
        onboard_objects()."""
        k, lens, n = _keys(keys)
        src = int32(src, "src")
        b, ba, m = block_ids(src_ids, "src_ids")
        if m != n:
            raise ValueError(f"{n} keys for {m} block ids: they must be as long")
        out = c_void_p()
        lib.kvbm_worker_offload_objects(self.handle, src, ba, k, lens, n, byref(out))
        return Notification(out.value)
