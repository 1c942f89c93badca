"""Integers crossing into C, checked against their C type.

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
from typing import Any, Iterable, Tuple

import numpy as np

from .errors import InvalidArgumentError

__all__ = ["int32", "uint32", "uint64", "pointer", "layer_range", "block_ids", "refuse",
           "SMALL_ARRAY", "keys"]

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


def keys(keys: Iterable[Any]) -> Tuple[Any, Any, int]:
    """Byte keys as C arrays (pointers, lengths) and their count. A str is
    UTF-8 encoded; the library checks the lengths (1 to 64 bytes)."""
    raw = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
    n = len(raw)
    return (ctypes.c_char_p * n)(*raw), (ctypes.c_size_t * n)(*map(len, raw)), n
