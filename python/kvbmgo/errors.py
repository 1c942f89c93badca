"""Exceptions: one class per kvbm status code, all under :class:`KvbmError`.

Where a builtin exception fits, a class is that one too, so that ``except
ValueError``, ``except LookupError`` or ``except OSError`` catches what it
says (the table is the decision; tests/test_errors.py checks it)::

    class                    status (kvbm_status_t)            also a subclass of
    ------------------------ ---------------------------- ---  ---------------------------------
    KvbmError                any error status                  Exception
    InvalidArgumentError     KVBM_ERR_INVALID_ARGUMENT     -1  ValueError
      OutOfRangeError        KVBM_ERR_OUT_OF_RANGE         -6  InvalidArgumentError, IndexError
    InvalidHandleError       KVBM_ERR_INVALID_HANDLE       -2  ValueError
    NotFoundError            KVBM_ERR_NOT_FOUND            -3  LookupError
    AlreadyExistsError       KVBM_ERR_ALREADY_EXISTS       -4  -
    FailedPreconditionError  KVBM_ERR_FAILED_PRECONDITION  -5  -
    BufferTooSmallError      KVBM_ERR_BUFFER_TOO_SMALL     -7  -
    KvbmIOError              KVBM_ERR_IO                   -8  OSError
    CudaError                KVBM_ERR_CUDA                 -9  -
    KvbmTimeoutError         KVBM_ERR_TIMEOUT             -10  TimeoutError (an OSError)
    CanceledError            KVBM_ERR_CANCELED            -11  -
    UnsupportedError         KVBM_ERR_UNSUPPORTED         -12  -
    DataCorruptionError      KVBM_ERR_DATA_CORRUPTION     -13  -
    InternalError            KVBM_ERR_INTERNAL            -14  -
    DeadlineExceededError    KVBM_ERR_DEADLINE_EXCEEDED   -15  CanceledError, TimeoutError
    UnknownStatusError       a status this package lacks       -

    not statuses, so not KvbmErrors:
    KvbmClosedError          an object used after close()      ValueError
    AbiMismatchError         the library's ABI differs         ImportError

An id or index beyond its bound is an invalid argument (the library's Go
core says so too: its out-of-range error is an invalid-argument error), so
``except InvalidArgumentError`` and ``except ValueError`` catch
OutOfRangeError, and ``except IndexError`` catches it as well. A handle
that is gone is a bad value whether Python sees it (KvbmClosedError) or the
library does (InvalidHandleError): both are ValueErrors. NotFoundError is a
LookupError, not a KeyError, whose str() would quote the message. Out of
memory has no status of its own, so no class is a MemoryError: the call
that allocates reports it, for pinned or device memory as a CudaError (the
driver's out-of-memory error, named in the message).

Beyond what a docstring names, any call may raise KvbmClosedError (the
object was closed), InvalidHandleError (its handle was freed behind its
back) and FailedPreconditionError (in a child forked after the library was
loaded).
"""

from __future__ import annotations

from typing import Dict, Optional, Type

__all__ = [
    "KvbmError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "NotFoundError",
    "AlreadyExistsError",
    "FailedPreconditionError",
    "OutOfRangeError",
    "BufferTooSmallError",
    "KvbmIOError",
    "CudaError",
    "KvbmTimeoutError",
    "CanceledError",
    "DeadlineExceededError",
    "UnsupportedError",
    "DataCorruptionError",
    "InternalError",
    "UnknownStatusError",
    "KvbmClosedError",
    "AbiMismatchError",
    "error_class",
]


class KvbmError(Exception):
    """An error status returned by libkvbm.

    Attributes:
        status: the numeric ``kvbm_status_t`` (negative).
        status_name: its name, e.g. ``"KVBM_ERR_INVALID_HANDLE"``.
        message: ``kvbm_last_error()`` of the thread that made the call.
        function: the C function that returned the status.
    """

    status: int = 0
    status_name: str = "KVBM_ERR_UNKNOWN"

    def __init__(self, message: str = "", *, status: Optional[int] = None,
                 function: str = "") -> None:
        if status is not None:
            self.status = status
        self.message = message
        self.function = function
        text = f"{function}: " if function else ""
        text += self.status_name
        if message:
            text += f": {message}"
        super().__init__(text)


class InvalidArgumentError(KvbmError, ValueError):
    """KVBM_ERR_INVALID_ARGUMENT: NULL pointer, bad length, bad value."""
    status, status_name = -1, "KVBM_ERR_INVALID_ARGUMENT"


class InvalidHandleError(KvbmError, ValueError):
    """KVBM_ERR_INVALID_HANDLE: freed, stale, never issued or wrong kind."""
    status, status_name = -2, "KVBM_ERR_INVALID_HANDLE"


class NotFoundError(KvbmError, LookupError):
    """KVBM_ERR_NOT_FOUND: no such layout, tier, object or remote."""
    status, status_name = -3, "KVBM_ERR_NOT_FOUND"


class AlreadyExistsError(KvbmError):
    """KVBM_ERR_ALREADY_EXISTS: a tier or handle set twice."""
    status, status_name = -4, "KVBM_ERR_ALREADY_EXISTS"


class FailedPreconditionError(KvbmError):
    """KVBM_ERR_FAILED_PRECONDITION: wrong state (e.g. used after fork())."""
    status, status_name = -5, "KVBM_ERR_FAILED_PRECONDITION"


class OutOfRangeError(InvalidArgumentError, IndexError):
    """KVBM_ERR_OUT_OF_RANGE: an index beyond its bound (an InvalidArgumentError
    and a ValueError, and an IndexError too)."""
    status, status_name = -6, "KVBM_ERR_OUT_OF_RANGE"


class BufferTooSmallError(KvbmError):
    """KVBM_ERR_BUFFER_TOO_SMALL: the size needed was written to an out param."""
    status, status_name = -7, "KVBM_ERR_BUFFER_TOO_SMALL"


class KvbmIOError(KvbmError, OSError):
    """KVBM_ERR_IO: file system or disk."""
    status, status_name = -8, "KVBM_ERR_IO"


class CudaError(KvbmError):
    """KVBM_ERR_CUDA: the device driver failed (or an unknown stream/event)."""
    status, status_name = -9, "KVBM_ERR_CUDA"


class KvbmTimeoutError(KvbmError, TimeoutError):
    """KVBM_ERR_TIMEOUT: a wait ended first; the work goes on."""
    status, status_name = -10, "KVBM_ERR_TIMEOUT"


class CanceledError(KvbmError):
    """KVBM_ERR_CANCELED: the worker was destroyed."""
    status, status_name = -11, "KVBM_ERR_CANCELED"


class UnsupportedError(KvbmError):
    """KVBM_ERR_UNSUPPORTED: no such path between tiers, or no such backend."""
    status, status_name = -12, "KVBM_ERR_UNSUPPORTED"


class DataCorruptionError(KvbmError):
    """KVBM_ERR_DATA_CORRUPTION: a checksum or format check failed."""
    status, status_name = -13, "KVBM_ERR_DATA_CORRUPTION"


class InternalError(KvbmError):
    """KVBM_ERR_INTERNAL: a bug in libkvbm; the message says where."""
    status, status_name = -14, "KVBM_ERR_INTERNAL"


class DeadlineExceededError(CanceledError, TimeoutError):
    """KVBM_ERR_DEADLINE_EXCEEDED: a transfer's deadline passed and stopped
    it (its operations were canceled, hence a CanceledError; unlike
    KvbmTimeoutError, the work is over)."""
    status, status_name = -15, "KVBM_ERR_DEADLINE_EXCEEDED"


class UnknownStatusError(KvbmError):
    """A negative status this package does not know (a newer library)."""


class KvbmClosedError(ValueError):
    """An object was used after ``close()`` (its handle is gone)."""


class AbiMismatchError(ImportError):
    """libkvbm's ABI version differs from the one this package was written for."""


_BY_STATUS: Dict[int, Type[KvbmError]] = {
    cls.status: cls
    for cls in (InvalidArgumentError, InvalidHandleError, NotFoundError, AlreadyExistsError,
                FailedPreconditionError, OutOfRangeError, BufferTooSmallError, KvbmIOError,
                CudaError, KvbmTimeoutError, CanceledError, UnsupportedError,
                DataCorruptionError, InternalError, DeadlineExceededError)
}


def error_class(status: int) -> Type[KvbmError]:
    """The exception class for a negative status (UnknownStatusError if unknown)."""
    return _BY_STATUS.get(status, UnknownStatusError)
