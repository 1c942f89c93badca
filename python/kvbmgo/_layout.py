"""Layouts: the tiers, the handle of a registered layout, and the shape of a
tier's KV cache (``kvbm_layout_config_t``)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _lib
from ._cint import int32, uint32, uint64
from ._memory import buffer_of

__all__ = ["Tier", "LayoutHandle", "LayoutKind", "BlockDim", "LayoutConfig"]


class Tier(enum.IntEnum):
    """KVBM_TIER_*."""
    G1 = 1  # the engine's KV cache in device memory
    G2 = 2  # pinned host memory, allocated by kvbm
    G3 = 3  # local disk, allocated by kvbm


class LayoutHandle(NamedTuple):
    """A registered layout: the owning worker's id and the layout's id within it."""
    worker: int
    layout: int

    def to_c(self, what: str = "layout handle") -> _lib.LayoutHandleC:
        """The C struct. Raises InvalidArgumentError or TypeError (naming what)
        for a field that is not a uint64."""
        return _lib.LayoutHandleC(uint64(self.worker, f"{what}.worker"),
                                  uint64(self.layout, f"{what}.layout"))


def handle_of(c: _lib.LayoutHandleC) -> LayoutHandle:
    return LayoutHandle(c.worker, c.layout)


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
    return int32(value, what)


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
        """The C struct. Raises InvalidArgumentError for a field that does not
        fit its C type (uint32; int32 for layout and block_dim), TypeError for
        one that is not an integer, ValueError for a layout or block_dim name
        that is none of them."""
        c = [uint32(getattr(self, name), f"LayoutConfig.{name}")
             for name in ("num_blocks", "num_layers", "outer_dim", "page_size", "inner_dim",
                          "dtype_width")]
        return _lib.LayoutConfigC(_lib.ctypes.sizeof(_lib.LayoutConfigC), *c, self.layout_kind,
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
        an empty input, mismatched shapes or dtypes, a shape that does not fit
        the layout, an unknown layout or block_dim name; TypeError for objects
        without a shape, and as buffer_of; InvalidArgumentError for a layout
        or block_dim value that does not fit an int32.
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
