"""What the library reports about itself: version, ABI, device backend, live handles."""

from __future__ import annotations

from ctypes import byref, c_size_t, sizeof
from dataclasses import dataclass
from typing import Optional, Tuple

from . import _lib
from ._cint import int32
from ._lib import lib

__all__ = ["Info", "info", "version", "handle_count", "status_string"]


@dataclass(frozen=True)
class Info:
    """What kvbm_info reports."""
    version: int
    abi_version: int
    device_backend: str
    device_count: int
    transport: str  # the network transport new workers get: "ucx", "tcp" or "loopback"


def info() -> Info:
    """The library's version, ABI version and device backend. Opens the backend
    (KVBM_DEVICE) if not yet open; raises UnsupportedError or CudaError if it
    cannot."""
    c = _lib.InfoC()
    c.struct_size = sizeof(c)
    lib.kvbm_info(byref(c))
    return Info(c.version, c.abi_version, c.device_backend.decode(), c.device_count, c.transport.decode())


def version() -> Tuple[int, int, int]:
    """The library's (major, minor, patch). Never fails."""
    v = lib.kvbm_version()
    return v // 10000, v // 100 % 100, v % 100


def handle_count() -> int:
    """Live handles of every kind (workers, coordinated workers, notifications,
    hand-off coordinators); 0 once everything created has been closed."""
    n = c_size_t()
    lib.kvbm_handle_count(byref(n))
    return n.value


def status_string(status: int) -> str:
    """The name of a status code ("KVBM_ERR_INVALID_HANDLE"; "KVBM_ERR_UNKNOWN"
    for a value that is none). Raises InvalidArgumentError (status does not
    fit an int32), TypeError."""
    return lib.kvbm_status_string(int32(status, "status")).decode()


_backend_name: Optional[str] = None


def backend() -> str:
    """The device backend's name ("cuda", "emulated"), asked once."""
    global _backend_name
    if _backend_name is None:
        _backend_name = info().device_backend
    return _backend_name
