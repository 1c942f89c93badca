"""Arguments crossing into C: integers checked against their C type, and
block ids, keys and metadata as C arrays.

ctypes converts a Python int to a C integer by truncation, silently: tier
``2**32 + 2`` would arrive as 2 and a worker id of -1 as ``2**64 - 1``. Every
integer argument is passed through one of these checks first. An integer
(``int``, an ``IntEnum``, a numpy integer) that does not fit raises
:class:`~kvbmgo.errors.InvalidArgumentError` (a ValueError) naming the
argument and its value; a bool or a non-integer raises TypeError naming it.
The fast path (a plain int in range) is one isinstance and two comparisons.
"""

from __future__ import annotations

from array import array
import ctypes
from typing import Any, Iterable, Sequence, Tuple, Union

import numpy as np

from .errors import InvalidArgumentError

__all__ = ["int32", "uint32", "uint64", "millis", "pointer", "layer_range", "block_ids",
           "refuse", "SMALL_ARRAY", "Ids", "transfer_ids", "lengths_differ", "metadata_bytes",
           "keys"]

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1

_U32 = np.dtype(np.uint32)


def refuse(value: Any, lo: int, hi: int, ctype: str, what: str) -> int:
    """The slow path: value as an int if it is an integer in [lo, hi], else
    TypeError (bool, non-integer) or InvalidArgumentError (out of range)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what}: expected an integer ({ctype}), got {type(value).__name__} "
                        f"{value!r}")
    v = int(value)
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{what} = {v} is outside {ctype} [{lo}, {hi}]")
    return v


def int32(value: Any, what: str) -> int:
    """value as a C int32_t (tiers, devices, ranks, enum values)."""
    if isinstance(value, int) and value.__class__ is not bool and INT32_MIN <= value <= INT32_MAX:
        return value
    return refuse(value, INT32_MIN, INT32_MAX, "int32", what)


def uint32(value: Any, what: str) -> int:
    """value as a C uint32_t."""
    if isinstance(value, int) and value.__class__ is not bool and 0 <= value <= UINT32_MAX:
        return value
    return refuse(value, 0, UINT32_MAX, "uint32", what)


def uint64(value: Any, what: str) -> int:
    """value as a C uint64_t (worker ids, instances, leaders, action ids)."""
    if isinstance(value, int) and value.__class__ is not bool and 0 <= value <= UINT64_MAX:
        return value
    return refuse(value, 0, UINT64_MAX, "uint64", what)


def millis(seconds: Any, what: str) -> int:
    """A positive duration in seconds as the uint32 milliseconds of the C ABI;
    InvalidArgumentError naming what otherwise."""
    ms = round(seconds * 1000)
    if not 0 < ms < 2**32:
        raise InvalidArgumentError(f"{what} must be > 0 and < {2**32 // 1000} s, got {seconds!r}")
    return ms


def pointer(value: Any, what: str) -> int:
    """A raw driver handle given as an int, as a C pointer (uintptr_t)."""
    if isinstance(value, int) and value.__class__ is not bool and 0 <= value <= UINT64_MAX:
        return value
    return refuse(value, 0, UINT64_MAX, "a pointer", what)


def layer_range(layers: Any) -> Tuple[int, int]:
    """A (start, end) layer range as two uint32."""
    try:
        start, end = layers
    except (TypeError, ValueError):
        raise TypeError(f"layers: expected a (start, end) pair of integers, got {layers!r}"
                        ) from None
    return uint32(start, "layers start"), uint32(end, "layers end")


def block_ids(ids: Any, what: str) -> Tuple[Any, int, int]:
    """(owner, address, count) of ids as a C uint32_t array: pass the address,
    keep the owner alive across the call.

    Accepts a sequence of ints or a 1-D integer numpy array. Raises TypeError
    (a bool, a non-integer, a non-integer dtype), InvalidArgumentError (an id
    outside [0, 2**32)), ValueError (a numpy array that is not 1-D).
    """
    given = ids
    cls = ids.__class__
    if cls is not list and cls is not tuple and isinstance(ids, np.ndarray):
        if ids.size > SMALL_ARRAY:
            return _large_numpy_ids(ids, what)
        ids = ids.tolist()  # nested for ndim > 1, floats, bools: refused below
    try:
        a = array("I", ids)  # checks each id against C's unsigned int, in C
        if bool in map(type, ids):
            raise TypeError
    except (TypeError, OverflowError):
        _refuse_ids(given, what)
        raise
    addr, n = a.buffer_info()
    return a, addr, n


#: Up to this many ids, a numpy array is converted as a list (cheaper than
#: reading its address through numpy).
SMALL_ARRAY = 64


def _large_numpy_ids(ids: np.ndarray, what: str) -> Tuple[Any, int, int]:
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{what}: dtype {ids.dtype} is not an integer dtype")
    if ids.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D array, got shape {ids.shape}")
    if ids.dtype != _U32 or not ids.flags.c_contiguous:
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) > UINT32_MAX):
            _refuse_ids(ids.tolist(), what)
        ids = np.ascontiguousarray(ids, dtype=np.uint32)
    return ids, ids.ctypes.data, int(ids.size)


def _refuse_ids(ids: Any, what: str) -> None:
    """Raises the error of the first id that is not a uint32 (or of a numpy
    array's dtype or shape)."""
    if isinstance(ids, np.ndarray):
        _large_numpy_ids(ids, what)
        ids = ids.tolist()
    for i, v in enumerate(ids):
        refuse(v, 0, UINT32_MAX, "uint32", f"{what}[{i}]")


#: Block ids as the calls take them: a sequence of ints or an integer numpy array.
Ids = Union[Sequence[int], Any]


def lengths_differ(n: int, m: int, a: str = "src_ids", b: str = "dst_ids") -> ValueError:
    """The error of two id lists that must be as long and are not."""
    return ValueError(f"{a} has {n} ids, {b} {m}: they must be as long")


_SEQUENCES = (list, tuple)


def transfer_ids(src_ids: Ids, dst_ids: Ids) -> Tuple[Any, int, Any, int, int]:
    """(src owner, src address, dst owner, dst address, count) of two id lists
    of one length; keep the owners alive across the call."""
    # The common case in one step: lists, tuples or small numpy arrays of
    # valid ids (block_ids does the same per list, and names a bad id).
    s, d = src_ids, dst_ids
    if s.__class__ is list and d.__class__ is list and len(s) == 1 and len(d) == 1:
        # One block each way (a small transfer's usual call): one array for both.
        a, b = s[0], d[0]
        if a.__class__ is int and b.__class__ is int and 0 <= a <= UINT32_MAX and 0 <= b <= UINT32_MAX:
            both = array("I", (a, b))
            p = both.buffer_info()[0]
            return both, p, both, p + both.itemsize, 1
    if s.__class__ is np.ndarray and s.size <= SMALL_ARRAY:
        s = s.tolist()  # nested for ndim > 1, floats, bools: refused below
    if d.__class__ is np.ndarray and d.size <= SMALL_ARRAY:
        d = d.tolist()
    if s.__class__ in _SEQUENCES and d.__class__ in _SEQUENCES:
        try:
            sa, da = array("I", s), array("I", d)
        except (TypeError, OverflowError):
            pass
        else:
            n = len(sa)
            if n == len(da) and bool not in map(type, s) and bool not in map(type, d):
                return sa, sa.buffer_info()[0], da, da.buffer_info()[0], n
    s, sa, n = block_ids(src_ids, "src_ids")
    d, da, m = block_ids(dst_ids, "dst_ids")
    if n != m:
        raise lengths_differ(n, m)
    return s, sa, d, da, n


def metadata_bytes(md: Union[bytes, bytearray, memoryview]) -> Tuple[bytes, int]:
    """Exported metadata as (bytes, length) for a C buffer argument."""
    b = bytes(md)
    return b, len(b)


def keys(keys: Iterable[Any]) -> Tuple[Any, Any, int]:
    """Byte keys as C arrays (pointers, lengths) and their count. A str is
    UTF-8 encoded; the library checks the lengths (1 to 64 bytes)."""
    raw = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
    n = len(raw)
    return (ctypes.c_char_p * n)(*raw), (ctypes.c_size_t * n)(*map(len, raw)), n
