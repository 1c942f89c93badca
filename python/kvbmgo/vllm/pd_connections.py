"""The decode's connections to prefill workers' metadata (pd_decode.py):
one per prefill worker id, each under its own kvbm instance id, so that a
transfer always runs against the metadata its pull got.

Other metadata for a worker id in use (a restarted prefill, or a forged
reply) waits until no pull uses the current one and then replaces it: a
forged request that makes the decode connect elsewhere waits for the pulls
in flight, never re-points them. A request's scoped metadata
(pd_prefill.pd_request_metadata) is connected under an instance of its
own for its pull only.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from typing import Any, Dict

from ..errors import AlreadyExistsError, FailedPreconditionError, KvbmError
from .pd_wire import Unanswered

__all__ = ["instance_id", "Conn", "Connections"]

#: Connected prefill workers a decode keeps while no pull uses them.
_IDLE_KEPT = 64


def instance_id(wid: int, metadata: bytes) -> int:
    """The kvbm instance id a decode worker files a prefill worker's
    metadata under: its identity (worker id and bytes), so that other
    metadata never re-points it."""
    d = hashlib.blake2b(wid.to_bytes(8, "little") + metadata, digest_size=8).digest()
    return int.from_bytes(d, "little") | 1  # never 0


class Conn:
    """A prefill worker's metadata the decode is connected to, under its own
    instance id; users: the pulls whose transfers run against it; scoped: a
    request's metadata (its own instance, dropped after its pull)."""
    __slots__ = ("md", "inst", "users", "stale", "scoped", "wid")

    def __init__(self, md: bytes, inst: int, scoped: bool = False, wid: int = 0) -> None:
        self.md, self.inst, self.users, self.stale = md, inst, 0, False
        self.scoped, self.wid = scoped, wid


class Connections:
    """The decode's connections, one per prefill worker id (the library
    keeps one peer per worker id): a pull uses the one its metadata names;
    other metadata for that worker id (a restarted prefill, or a forged
    reply) waits until no pull uses the current one, and then replaces it,
    so that a transfer always runs against the metadata its pull got."""

    def __init__(self, worker: Any) -> None:
        self._worker = worker
        self._cv = threading.Condition()
        self._by_wid: "OrderedDict[int, Conn]" = OrderedDict()
        self._scoped: Dict[int, int] = {}  # worker id -> request-scoped pulls connected

    def acquire(self, wid: int, md: bytes, deadline: float, stop: threading.Event) -> Conn:
        with self._cv:
            while True:
                c = self._by_wid.get(wid)
                if c is not None and c.md == md and not c.stale:
                    c.users += 1
                    self._by_wid.move_to_end(wid)
                    return c
                if (c is None or c.users == 0) and not self._scoped.get(wid):
                    break
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    raise Unanswered(f"pulls in flight use other metadata of worker {wid:x} "
                                      f"until the deadline")
                self._cv.wait(min(left, 0.1))
            if c is not None:
                self._drop(wid, c)
            inst = instance_id(wid, md)
            try:
                self._worker.connect_remote(inst, md)
            except AlreadyExistsError:
                pass
            c = Conn(md, inst)
            c.users = 1
            self._by_wid[wid] = c
            for other, oc in list(self._by_wid.items()):  # forget idle ones beyond a few
                if len(self._by_wid) <= _IDLE_KEPT:
                    break
                if oc.users == 0:
                    self._drop(other, oc)
            return c

    def acquire_scoped(self, wid: int, md: bytes, deadline: float,
                       stop: threading.Event) -> Conn:
        """Connects a request's metadata (it covers that request's blocks
        only) under its own instance, until release: the library reaches the
        prefill worker through one peer for all of them. Waits while a pull
        uses whole-worker metadata of wid, or (the library says so:
        FailedPreconditionError) scopes of another server claiming wid, so
        that nothing in flight is re-pointed."""
        inst = instance_id(wid, md)
        with self._cv:
            while True:
                c = self._by_wid.get(wid)
                if c is None or c.users == 0:
                    break
                self._wait(wid, deadline, stop)
            if c is not None:
                self._drop(wid, c)
            self._scoped[wid] = self._scoped.get(wid, 0) + 1
        try:
            while True:
                try:
                    self._worker.connect_remote(inst, md)
                    break
                except FailedPreconditionError as e:
                    if "request-scoped" not in str(e):
                        raise
                    with self._cv:
                        self._wait(wid, deadline, stop)
        except BaseException:
            self._unscope(wid)
            raise
        c = Conn(md, inst, scoped=True, wid=wid)
        c.users = 1
        return c

    def _wait(self, wid: int, deadline: float, stop: threading.Event) -> None:
        """Waits a little for pulls of wid to end (self._cv held); raises
        Unanswered past the deadline."""
        left = deadline - time.monotonic()
        if left <= 0 or stop.is_set():
            raise Unanswered(f"pulls in flight use other metadata of worker {wid:x} "
                              f"until the deadline")
        self._cv.wait(min(left, 0.1))

    def _unscope(self, wid: int) -> None:
        with self._cv:
            n = self._scoped.get(wid, 0) - 1
            if n > 0:
                self._scoped[wid] = n
            else:
                self._scoped.pop(wid, None)
            self._cv.notify_all()

    def release(self, c: Conn, failed: bool) -> None:
        """A pull's transfer against c ended; failed: connect again next time
        (a restarted prefill). A request's metadata is dropped now."""
        if c.scoped:
            try:
                self._worker.disconnect_remote(c.inst)
            except KvbmError:
                pass
            self._unscope(c.wid)
            return
        with self._cv:
            c.users -= 1
            c.stale = c.stale or failed
            self._cv.notify_all()

    def _drop(self, wid: int, c: Conn) -> None:
        del self._by_wid[wid]
        try:
            self._worker.disconnect_remote(c.inst)
        except KvbmError:
            pass

