"""The base of every object that owns a libkvbm handle."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

from .errors import KvbmClosedError, KvbmError

__all__ = ["Handle"]


def _finalize(free: Callable[[int], Any], handle: int, *keep: Any) -> None:
    """The finalizer of a forgotten object: frees its handle, never raises. keep
    holds what must outlive the handle (e.g. registered G1 memory)."""
    try:
        free(handle)
    except KvbmError:
        pass


class Handle:
    """An owned libkvbm handle: close(), a context manager, weakref.finalize."""

    __slots__ = ("_h", "_finalizer", "__weakref__")
    _kind = "object"

    def _own(self, handle: int, free: Callable[[int], Any], *keep: Any) -> None:
        self._h: Optional[int] = handle
        # The finalizer holds the handle and free function, never self.
        self._finalizer = weakref.finalize(self, _finalize, free, handle, *keep)

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
        error if the free fails (the object is closed all the same; only the
        finalizer of a forgotten object stays silent)."""
        self._h = None
        fin = getattr(self, "_finalizer", None)
        if fin is None:
            return
        detached = fin.detach()
        if detached is not None:
            _, _, args, _ = detached
            free, handle = args[0], args[1]
            free(handle)

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"handle={self._h:#x}"
        return f"<kvbmgo.{type(self).__name__} {state}>"
