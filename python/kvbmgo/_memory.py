"""Memory passed to libkvbm: numpy arrays, C-contiguous buffers, torch tensors."""

from __future__ import annotations

import math
from ctypes import c_uint32
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib

__all__ = ["LayoutConfig", "LayoutKind", "BlockDim", "Buffer", "buffer_of", "block_ids"]

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


_MAX_ID = 0xFFFFFFFF


def block_ids(ids: Any, what: str = "block ids") -> Tuple[Any, int]:
    """(a C uint32 array, count) for ids; the array owns or keeps alive its memory.

    Accepts a sequence of ints or an integer numpy array. Raises TypeError for
    non-integers, ValueError for an id outside [0, 2**32).
    """
    if isinstance(ids, np.ndarray):
        if ids.dtype.kind not in "iu":
            raise TypeError(f"{what}: dtype {ids.dtype} is not an integer dtype")
        if ids.ndim != 1:
            raise ValueError(f"{what}: expected a 1-D array, got shape {ids.shape}")
        if ids.dtype != np.uint32 or not ids.flags.c_contiguous or not ids.flags.writeable:
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) > _MAX_ID):
                raise ValueError(f"{what}: an id is outside [0, 2**32)")
            ids = np.array(ids, dtype=np.uint32)  # a contiguous, writeable copy
        n = int(ids.size)
        # A ctypes view keeps the array alive as long as the argument lives.
        return (c_uint32 * n).from_buffer(ids), n
    n = len(ids)
    try:
        arr = (c_uint32 * n)(*ids)
    except TypeError:
        raise TypeError(f"{what}: expected integers, got {ids!r}") from None
    if n and (min(ids) < 0 or max(ids) > _MAX_ID):
        raise ValueError(f"{what}: an id is outside [0, 2**32)")
    return arr, n


class LayoutKind:
    """KVBM_LAYOUT_*: how a tier's memory is arranged."""
    FULLY_CONTIGUOUS = 1  # one region [block][layer][outer][page][inner]
    LAYER_SEPARATE = 2    # one region per layer, arranged by BlockDim


class BlockDim:
    """KVBM_BLOCK_DIM_*, for LayoutKind.LAYER_SEPARATE."""
    FIRST = 0   # [block][outer][page][inner] per layer
    SECOND = 1  # [outer][block][page][inner] per layer (vLLM FlashAttention)


_KIND_NAMES = {"fully_contiguous": LayoutKind.FULLY_CONTIGUOUS,
               "layer_separate": LayoutKind.LAYER_SEPARATE}
_DIM_NAMES = {"first": BlockDim.FIRST, "second": BlockDim.SECOND}


def _enum(value: Union[str, int], names: Dict[str, int], what: str) -> int:
    if isinstance(value, str):
        try:
            return names[value.lower()]
        except KeyError:
            raise ValueError(f"{what} must be one of {sorted(names)}, got {value!r}") from None
    return int(value)


def _shape(obj: Any) -> Tuple[int, ...]:
    return tuple(int(d) for d in obj.shape)


@dataclass(frozen=True)
class LayoutConfig:
    """The shape of one tier's KV cache (``kvbm_layout_config_t``).

    A block is ``num_layers * outer_dim * page_size * inner_dim * dtype_width``
    bytes. ``layout`` is "layer_separate" or "fully_contiguous" (or a
    LayoutKind value), ``block_dim`` "first" or "second" (or a BlockDim).
    """
    num_blocks: int
    num_layers: int
    outer_dim: int
    page_size: int
    inner_dim: int
    dtype_width: int
    layout: Union[str, int] = "fully_contiguous"
    block_dim: Union[str, int] = "first"

    @property
    def layout_kind(self) -> int:
        return _enum(self.layout, _KIND_NAMES, "layout")

    @property
    def block_dim_value(self) -> int:
        return _enum(self.block_dim, _DIM_NAMES, "block_dim")

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over every layer."""
        return self.num_layers * self.outer_dim * self.page_size * self.inner_dim * self.dtype_width

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer's region under LAYER_SEPARATE."""
        return self.num_blocks * self.outer_dim * self.page_size * self.inner_dim * self.dtype_width

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def replace(self, **changes: Any) -> "LayoutConfig":
        """A copy with some fields changed (e.g. ``layout="fully_contiguous"`` for G2)."""
        import dataclasses
        return dataclasses.replace(self, **changes)

    def to_c(self) -> _lib.LayoutConfigC:
        """The C struct (raises ValueError for a field that does not fit)."""
        for name in ("num_blocks", "num_layers", "outer_dim", "page_size", "inner_dim",
                     "dtype_width"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or not 0 <= int(v) <= _MAX_ID:
                raise ValueError(f"LayoutConfig.{name} must be an int in [0, 2**32), got {v!r}")
        return _lib.LayoutConfigC(
            _lib.ctypes.sizeof(_lib.LayoutConfigC), self.num_blocks, self.num_layers,
            self.outer_dim, self.page_size, self.inner_dim, self.dtype_width, self.layout_kind,
            self.block_dim_value)

    @classmethod
    def from_kv_caches(cls, kv_caches: Union[Mapping[str, Any], Sequence[Any]], *,
                       page_size: Optional[int] = None, layout: Union[str, int] = "layer_separate",
                       block_dim: Union[str, int] = "second") -> "LayoutConfig":
        """Infers the layout of an engine's per-layer KV tensors or arrays.

        kv_caches is what vLLM hands ``register_kv_caches`` (a dict of layer
        name -> tensor, in layer order) or a list. Per layer, the shape is
        ``[outer, num_blocks, page, *inner]`` for block_dim "second" (vLLM
        FlashAttention: ``[2, num_blocks, block_size, heads, head_size]``) and
        ``[num_blocks, outer, page, *inner]`` or, for MLA,
        ``[num_blocks, page, *inner]`` for block_dim "first". For
        "fully_contiguous", one tensor ``[num_blocks, num_layers, outer, page, *inner]``.
        page_size, when given, must match the shape's. Raises ValueError for
        an empty input, mismatched shapes or dtypes, TypeError for objects
        without a shape.
        """
        tensors = list(kv_caches.values()) if isinstance(kv_caches, Mapping) else list(kv_caches)
        if not tensors:
            raise ValueError("from_kv_caches: no KV caches")
        for t in tensors:
            if not hasattr(t, "shape"):
                raise TypeError(f"from_kv_caches: {type(t).__name__} has no shape")
        shape = _shape(tensors[0])
        width = buffer_of(tensors[0], "kv cache 0").itemsize
        for i, t in enumerate(tensors[1:], 1):
            if _shape(t) != shape or buffer_of(t, f"kv cache {i}").itemsize != width:
                raise ValueError(f"from_kv_caches: kv cache {i} has shape {_shape(t)} and "
                                 f"width {buffer_of(t).itemsize}, kv cache 0 {shape} and {width}")
        kind = _enum(layout, _KIND_NAMES, "layout")
        dim = _enum(block_dim, _DIM_NAMES, "block_dim")
        if kind == LayoutKind.FULLY_CONTIGUOUS:
            if len(tensors) != 1 or len(shape) < 5:
                raise ValueError("from_kv_caches: fully_contiguous takes one tensor "
                                 "[num_blocks, num_layers, outer, page, *inner]")
            nb, nl, outer, page = shape[:4]
            inner = math.prod(shape[4:])
        else:
            nl = len(tensors)
            if dim == BlockDim.SECOND:
                if len(shape) < 4:
                    raise ValueError(f"from_kv_caches: shape {shape} is not "
                                     f"[outer, num_blocks, page, *inner]")
                outer, nb, page = shape[:3]
                inner = math.prod(shape[3:])
            elif len(shape) >= 4:
                nb, outer, page = shape[:3]
                inner = math.prod(shape[3:])
            elif len(shape) == 3:
                nb, page, inner = shape
                outer = 1
            else:
                raise ValueError(f"from_kv_caches: shape {shape} is not "
                                 f"[num_blocks, outer, page, *inner]")
        if page_size is not None and page_size != page:
            raise ValueError(f"from_kv_caches: page_size={page_size} but the shape {shape} "
                             f"has {page} tokens per block")
        return cls(num_blocks=nb, num_layers=nl, outer_dim=outer, page_size=page,
                   inner_dim=inner, dtype_width=width, layout=kind, block_dim=dim)
