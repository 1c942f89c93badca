"""The options of a transfer call (kvbm_transfer_options_t), from the keyword
arguments of Worker's and CoordinatedWorker's transfers."""

from __future__ import annotations

from ctypes import byref, sizeof
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from . import _lib
from ._cint import layer_range, millis, uint32
from ._device import Event, Stream, pointer_of

__all__ = ["options", "HeadSlice"]


#: kvbm_head_order_t by name: vLLM's names of a block's order.
_HEAD_ORDERS = {"HND": 1, "NHD": 2}


@dataclass(frozen=True)
class HeadSlice:
    """A transfer of part of each fragment's KV heads (tensor-parallel sizes
    that differ): heads [src_first, src_first + count) of every source
    fragment of src_heads heads fill heads [dst_first, dst_first + count)
    of the destination's fragments of dst_heads heads, every token; orders
    "HND" (heads outermost in a block) or "NHD" (tokens outermost). The
    library checks it against the two layouts (InvalidArgumentError)."""
    count: int
    src_heads: int
    src_first: int
    src_order: str
    dst_heads: int
    dst_first: int
    dst_order: str

    def fill(self, o: Any) -> None:
        """Writes the slice into kvbm_transfer_options_t o."""
        for name in ("src_order", "dst_order"):
            if getattr(self, name) not in _HEAD_ORDERS:
                raise ValueError(f"HeadSlice.{name} is {getattr(self, name)!r}, not 'HND' or 'NHD'")
        o.head_count = uint32(self.count, "head count")
        o.src_heads, o.dst_heads = uint32(self.src_heads, "src_heads"), uint32(self.dst_heads, "dst_heads")
        o.src_head_first = uint32(self.src_first, "src_first")
        o.dst_head_first = uint32(self.dst_first, "dst_first")
        o.src_head_order, o.dst_head_order = _HEAD_ORDERS[self.src_order], _HEAD_ORDERS[self.dst_order]


def options(layers: Optional[Tuple[int, int]], stream: Any, precondition: Any,
            deadline: Optional[float] = None, heads: Optional[HeadSlice] = None) -> Any:
    """The transfer options by reference, or None when every one is the default.
    deadline (seconds) bounds the transfer's operations on a peer's memory;
    heads moves a slice of each fragment's heads."""
    if layers is None and stream is None and precondition is None and deadline is None \
            and heads is None:
        return None
    o = _lib.TransferOptionsC()
    o.struct_size = sizeof(o)
    if heads is not None:
        heads.fill(o)
    if deadline is not None:
        o.deadline_ms = millis(deadline, "deadline")
    if layers is not None:
        o.layer_start, o.layer_end = layer_range(layers)
    o.stream = pointer_of(stream, Stream, "stream")
    o.precondition = pointer_of(precondition, Event, "precondition")
    return byref(o)  # keeps o alive
