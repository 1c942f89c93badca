"""Memory passed to libkvbm: numpy arrays, C-contiguous buffers, torch tensors."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

__all__ = ["Buffer", "buffer_of"]

# The element kinds accepted as KV memory: bool, ints, unsigned ints, floats, complex.
_KINDS = "biufc"


class Buffer(NamedTuple):
    """A described region of caller memory."""
    address: int
    nbytes: int
    itemsize: int
    device: Optional[int]  # CUDA device index of a torch CUDA tensor, else None
    owner: Any             # what to keep alive while the memory is in use: for a buffer
                           # object, the array over its memoryview, which holds the buffer
                           # export (a bytearray cannot be resized while it lives)


def _is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def buffer_of(obj: Any, what: str = "buffer") -> Buffer:
    """Describes obj's memory without copying.

    Accepts a torch tensor (``data_ptr()``, ``element_size()``, its CUDA device),
    a numpy array, or any object with the buffer protocol. Raises TypeError for
    other objects and for non-numeric dtypes, ValueError for memory that is
    not C-contiguous, read-only or empty.
    """
    if _is_torch_tensor(obj):
        if not obj.is_contiguous():
            raise ValueError(f"{what}: tensor is not contiguous (call .contiguous())")
        itemsize = int(obj.element_size())
        nbytes = int(obj.numel()) * itemsize
        if nbytes == 0:
            raise ValueError(f"{what}: tensor is empty")
        dev = obj.device
        kind = getattr(dev, "type", "cpu")
        if kind not in ("cpu", "cuda"):
            raise TypeError(f"{what}: a {kind} tensor is neither host memory nor CUDA memory")
        device = (dev.index or 0) if kind == "cuda" else None
        return Buffer(int(obj.data_ptr()), nbytes, itemsize, device, obj)
    if isinstance(obj, np.ndarray):
        arr = owner = obj
    else:
        try:
            view = memoryview(obj)
        except TypeError:
            raise TypeError(f"{what}: expected a numpy array, a C-contiguous buffer or a torch "
                            f"tensor, got {type(obj).__name__}") from None
        if not view.c_contiguous:
            raise ValueError(f"{what}: buffer is not C-contiguous")
        # The array's base is the memoryview, which holds the buffer export for
        # as long as the array lives: keeping the array (not obj) alive keeps obj
        # from being resized or freed under the library (BufferError on resize).
        arr = owner = np.asarray(view)
    if arr.dtype.kind not in _KINDS:
        raise TypeError(f"{what}: dtype {arr.dtype} is not numeric (expected bool, int, uint, "
                        f"float or complex)")
    if not arr.flags.c_contiguous:
        raise ValueError(f"{what}: array is not C-contiguous (use numpy.ascontiguousarray, "
                         f"which copies: register the copy and keep using it)")
    if not arr.flags.writeable:
        raise ValueError(f"{what}: array is read-only")
    if arr.nbytes == 0:
        raise ValueError(f"{what}: array is empty")
    return Buffer(int(arr.__array_interface__["data"][0]), int(arr.nbytes),
                  int(arr.dtype.itemsize), None, owner)
