"""The notification of one transfer: poll, wait, await, failed blocks."""

from __future__ import annotations

import asyncio
import ctypes
import math
import weakref
from ctypes import byref, c_size_t
from typing import Any, Generator, List, Optional

from ._handle import Handle, _collected, _live
from ._lib import KVBM_OK, lib
from .errors import (BufferTooSmallError, FailedPreconditionError, InvalidHandleError,
                     KvbmError, KvbmTimeoutError)

__all__ = ["Notification"]


class Notification(Handle):
    """Tracks one transfer. Returned by Worker transfers; close it when done
    (or use ``with``); a transfer still running goes on after close().

    ``await notification`` waits without blocking the event loop.
    """

    __slots__ = ()
    _kind = "Notification"

    def __init__(self, handle: int) -> None:
        # Handle._own inlined: one Notification per transfer call.
        self._h = handle
        ref = self._finalizer = weakref.ref(self, _collected)
        _live[ref] = (lib.kvbm_notification_free, handle, ())

    def poll(self) -> bool:
        """True when the transfer completed successfully, False while it runs.
        Raises the transfer's error (CudaError, KvbmIOError,
        DataCorruptionError, NotFoundError, CanceledError, ...; see
        failed_blocks()), InvalidHandleError."""
        return lib.kvbm_notification_poll(self.handle) == KVBM_OK

    def done(self) -> bool:
        """True once the transfer finished, successfully or not (as
        ``Future.done()``); never raises the transfer's error (poll(), wait()
        or failed_blocks() tell how it went). Raises KvbmClosedError after
        close(), InvalidHandleError."""
        h = self.handle  # KvbmClosedError after close()
        try:
            return lib.kvbm_notification_poll(h) == KVBM_OK
        except (InvalidHandleError, FailedPreconditionError):
            raise  # about the handle or the process, not the transfer
        except KvbmError:
            return True  # finished, with the transfer's error

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks (GIL released) until the transfer completes or timeout seconds
        pass (None or math.inf: forever). True when it completed successfully,
        False on a timeout (the transfer goes on; wait again). Raises the
        transfer's error (as poll()); ValueError for a NaN timeout."""
        ms = _timeout_ms(timeout)
        h = self.handle
        if lib.kvbm_notification_poll_unchecked(h) == KVBM_OK:
            return True  # done already: no blocking call (it releases the GIL)
        try:
            lib.kvbm_notification_wait(h, ms)
        except KvbmTimeoutError:
            # The library may report a timeout for a transfer that finished
            # as the time ran out (with 0 ms, even long after): ask once more.
            return lib.kvbm_notification_poll(h) == KVBM_OK
        return True

    async def wait_async(self, timeout: Optional[float] = None) -> bool:
        """As wait(), for asyncio: polls with a growing asyncio.sleep (50 µs up
        to 5 ms), never blocking the event loop; cancellation-safe. Raises as
        poll()."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = 50e-6
        while not self.poll():
            if deadline is not None and loop.time() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5e-3)
        return True

    def __await__(self) -> Generator[Any, None, bool]:
        return self.wait_async().__await__()

    def cancel(self) -> None:
        """Stops the transfer's operations on another process's memory that have
        not completed: their blocks fail (CanceledError from wait), the others
        complete as they would. Once the transfer completes nothing more is
        written to its destination blocks; wait for it before reusing them.
        Copies already handed to the device or the disk finish first; a
        transfer without remote operations is not changed."""
        lib.kvbm_notification_cancel(self.handle)

    def failed_blocks(self) -> List[int]:
        """The destination block ids whose data is not valid (sorted; empty while
        pending or on success)."""
        h = self.handle
        n = c_size_t()
        buf = (ctypes.c_uint32 * 0)()
        while True:
            try:
                lib.kvbm_notification_failed_blocks(h, buf if len(buf) else None, len(buf),
                                                    byref(n))
                return list(buf[:n.value])
            except BufferTooSmallError:
                buf = (ctypes.c_uint32 * n.value)()


def _timeout_ms(timeout: Optional[float]) -> int:
    """Seconds as kvbm_notification_wait's milliseconds: -1 (forever) for None,
    infinity or more than an int64 of milliseconds; 0 for a negative timeout."""
    if timeout is None:
        return -1
    timeout = float(timeout)
    if math.isnan(timeout):
        raise ValueError("wait: timeout is NaN")
    if timeout <= 0:
        return 0
    if math.isinf(timeout) or timeout * 1000 >= 2**63 - 1:
        return -1
    return int(timeout * 1000)
