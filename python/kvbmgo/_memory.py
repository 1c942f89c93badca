"""Memory passed to libkvbm: numpy arrays, C-contiguous buffers, torch tensors."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

__all__ = ["Buffer", "buffer_of", "dense_span"]

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
    not C-contiguous, read-only or empty. A Buffer (e.g. from dense_span) is
    taken as it is.
    """
    if isinstance(obj, Buffer):
        if obj.nbytes <= 0 or obj.itemsize <= 0 or obj.address == 0:
            raise ValueError(f"{what}: empty or null memory ({obj.nbytes} bytes at "
                             f"{obj.address:#x})")
        return obj
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


def dense_span(obj: Any, what: str = "tensor") -> Buffer:
    """The memory under a strided view whose strides are a permutation of a
    dense layout of its shape (e.g. ``t.permute(...)`` of a contiguous
    tensor, or vLLM's per-layer KV cache views): the address of its first
    element and the bytes it spans, which it covers exactly, without a gap
    or an overlap. No copy; the view is kept alive as the owner. Accepts a
    torch tensor or a numpy array. Raises ValueError for a view with gaps,
    overlaps or a negative stride (it is not one dense region), TypeError as
    buffer_of."""
    if _is_torch_tensor(obj):
        shape = [int(d) for d in obj.shape]
        strides = [int(s) for s in obj.stride()]  # in elements
        itemsize = int(obj.element_size())
        address = int(obj.data_ptr())
        dev = obj.device
        kind = getattr(dev, "type", "cpu")
        if kind not in ("cpu", "cuda"):
            raise TypeError(f"{what}: a {kind} tensor is neither host memory nor CUDA memory")
        device = (dev.index or 0) if kind == "cuda" else None
    elif isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _KINDS:
            raise TypeError(f"{what}: dtype {obj.dtype} is not numeric")
        if not obj.flags.writeable:
            raise ValueError(f"{what}: array is read-only")
        itemsize = int(obj.dtype.itemsize)
        shape = [int(d) for d in obj.shape]
        strides = []
        for s in obj.strides:
            if s % itemsize:
                raise ValueError(f"{what}: stride {s} is not a multiple of the element size")
            strides.append(s // itemsize)
        address = int(obj.__array_interface__["data"][0])
        device = None
    else:
        raise TypeError(f"{what}: expected a torch tensor or a numpy array, "
                        f"got {type(obj).__name__}")
    n = 1
    for d in shape:
        n *= d
    if n == 0:
        raise ValueError(f"{what}: empty")
    # Dense iff, sorted by stride, each dimension's stride is the product of
    # the sizes of the dimensions inside it (size-1 dimensions are free).
    dims = sorted((s, d) for s, d in zip(strides, shape) if d != 1)
    expect = 1
    for s, d in dims:
        if s != expect:
            raise ValueError(f"{what}: shape {tuple(shape)} with strides {tuple(strides)} is "
                             f"not one dense region (a gap, an overlap or a negative stride)")
        expect *= d
    return Buffer(address, n * itemsize, itemsize, device, obj)
