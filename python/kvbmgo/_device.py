"""Device streams and events made by kvbm, and raw driver handles given as ints."""

from __future__ import annotations

from ctypes import byref, c_void_p
from typing import Any, Optional, Union

from ._cint import int32, pointer
from ._handle import Handle
from ._lib import KVBM_OK, lib

__all__ = ["Stream", "Event", "pointer_of"]


def pointer_of(obj: Any, kind: type, what: str) -> Optional[int]:
    """A Stream/Event (or a raw driver handle as an int, or None) as a pointer.
    Raises TypeError (another type), InvalidArgumentError (an int that is not
    a pointer), KvbmClosedError (a closed Stream/Event)."""
    if obj is None:
        return None
    if isinstance(obj, kind):
        return obj.handle
    if isinstance(obj, int) and obj.__class__ is not bool:
        return pointer(obj, what)
    raise TypeError(f"{what}: expected {kind.__name__}, an int driver handle or None, "
                    f"got {type(obj).__name__}")


class Stream(Handle):
    """A non-blocking device stream made by kvbm (works under every backend)."""

    __slots__ = ()
    _kind = "Stream"

    def __init__(self, device: int = 0) -> None:
        """Creates a stream on device. Raises CudaError (no such device),
        InvalidArgumentError (device does not fit an int32), TypeError."""
        device = int32(device, "device")
        h = c_void_p()
        lib.kvbm_stream_create(device, byref(h))
        self._own(h.value, lib.kvbm_stream_destroy)

    def synchronize(self) -> None:
        """Blocks (GIL released) until the work queued on the stream is done.
        Raises CudaError if it failed."""
        lib.kvbm_stream_synchronize(self.handle)

    def wait_event(self, event: "Union[Event, int]") -> None:
        """Makes work queued on this stream after the call wait for event's
        capture. Raises CudaError (an unknown event), and as pointer_of."""
        lib.kvbm_stream_wait_event(self.handle, pointer_of(event, Event, "event"))


class Event(Handle):
    """A device event made by kvbm (timing disabled). An engine's own event
    can be passed instead as an int (e.g. ``torch.cuda.Event().cuda_event``)."""

    __slots__ = ()
    _kind = "Event"

    def __init__(self, device: int = 0) -> None:
        """Creates an event on device. Raises CudaError (no such device),
        InvalidArgumentError (device does not fit an int32), TypeError."""
        device = int32(device, "device")
        h = c_void_p()
        lib.kvbm_event_create(device, byref(h))
        self._own(h.value, lib.kvbm_event_destroy)

    def record(self, stream: "Union[Stream, int, None]" = None) -> None:
        """Captures the work queued on stream so far (None: the legacy default
        stream). Raises CudaError (an unknown stream), and as pointer_of."""
        lib.kvbm_event_record(self.handle, pointer_of(stream, Stream, "stream"))

    def query(self) -> bool:
        """True when the captured work is done (or never recorded), False while
        pending. Raises CudaError if the work failed."""
        return lib.kvbm_event_query(self.handle) == KVBM_OK

    def synchronize(self) -> None:
        """Blocks (GIL released) until the captured work is done. Raises CudaError."""
        lib.kvbm_event_synchronize(self.handle)
