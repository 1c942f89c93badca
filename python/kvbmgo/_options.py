"""The options of a transfer call (kvbm_transfer_options_t), from the keyword
arguments of Worker's and CoordinatedWorker's transfers."""

from __future__ import annotations

from ctypes import byref, sizeof
from typing import Any, Optional, Tuple

from . import _lib
from ._cint import layer_range, millis
from ._device import Event, Stream, pointer_of

__all__ = ["options"]


def options(layers: Optional[Tuple[int, int]], stream: Any, precondition: Any,
            deadline: Optional[float] = None) -> Any:
    """The transfer options by reference, or None when every one is the default.
    deadline (seconds) bounds the transfer's operations on a peer's memory."""
    if layers is None and stream is None and precondition is None and deadline is None:
        return None
    o = _lib.TransferOptionsC()
    o.struct_size = sizeof(o)
    if deadline is not None:
        o.deadline_ms = millis(deadline, "deadline")
    if layers is not None:
        o.layer_start, o.layer_end = layer_range(layers)
    o.stream = pointer_of(stream, Stream, "stream")
    o.precondition = pointer_of(precondition, Event, "precondition")
    return byref(o)  # keeps o alive
