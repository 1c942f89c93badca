"""The base of every object that owns a libkvbm handle."""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Callable, Dict, Optional, Tuple

from .errors import KvbmClosedError, KvbmError

__all__ = ["Handle"]


def _finalize(free: Callable[[int], Any], handle: int) -> None:
    """Frees a forgotten object's handle, never raises."""
    try:
        free(handle)
    except KvbmError:
        pass


#: What frees each live handle, by a weak reference to the object owning
#: it: (free function, handle, what must outlive the handle, e.g.
#: registered G1 memory), never the object. As ``weakref.finalize`` in a
#: fraction of its time (a transfer creates one per call). Whoever pops an
#: entry frees that handle, exactly once (``dict.pop`` is atomic); the
#: entries left at exit are freed newest first.
_live: Dict["weakref.ref[Any]", Tuple[Callable[[int], Any], int, Tuple[Any, ...]]] = {}


def _collected(ref: "weakref.ref[Any]") -> None:
    """The weakref callback: the object is gone without close()."""
    owned = _live.pop(ref, None)
    if owned is not None:
        _finalize(owned[0], owned[1])


@atexit.register
def _free_at_exit() -> None:
    for ref in reversed(list(_live)):
        _collected(ref)


class Handle:
    """An owned libkvbm handle: close(), a context manager, and a finalizer
    that frees the handle of a forgotten object (or at exit)."""

    __slots__ = ("_h", "_finalizer", "__weakref__")
    _kind = "object"

    def _own(self, handle: int, free: Callable[[int], Any], *keep: Any) -> None:
        self._h: Optional[int] = handle
        ref = self._finalizer = weakref.ref(self, _collected)
        _live[ref] = (free, handle, keep)

    @property
    def handle(self) -> int:
        """The raw C handle (an int). Raises KvbmClosedError after close()."""
        h = self._h
        if h is None:
            raise KvbmClosedError(f"{self._kind} is closed")
        return h

    @property
    def closed(self) -> bool:
        return self._h is None

    def close(self) -> None:
        """Frees the handle; a second close does nothing. Raises the library's
        error if the free fails (InvalidHandleError: freed behind the
        object's back; the object is closed all the same; only the finalizer
        of a forgotten object stays silent)."""
        self._h = None
        ref = getattr(self, "_finalizer", None)
        owned = _live.pop(ref, None) if ref is not None else None
        if owned is not None:
            owned[0](owned[1])

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"handle={self._h:#x}"
        return f"<kvbmgo.{type(self).__name__} {state}>"
