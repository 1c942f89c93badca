"""Loading libkvbm.so and the one table of its C functions.

Every function of ``include/kvbm.h`` is declared in :data:`FUNCTIONS` with its
restype, argtypes and errcheck. Status-returning functions raise the
:mod:`kvbmgo.errors` class of a negative status, carrying ``kvbm_last_error()``
fetched by errcheck on the calling thread, right after the call.

The library is loaded on first use (the first attribute read from
:data:`lib`), never at import: loading starts the Go runtime, which does not
survive ``fork()``, and engines import their connector classes in a parent
that forks its workers later.
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_int32, c_size_t,
                    c_uint8, c_uint32, c_uint64, c_void_p)
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from .errors import AbiMismatchError, error_class

#: The KVBM_ABI_VERSION this package was written against.
ABI_VERSION = 1

KVBM_OK = 0
KVBM_IN_PROGRESS = 1
KVBM_HANDOFF_MAX_ACTIONS = 2
KVBM_MAX_KEY_LEN = 64

# ------------------------------------------------------------------ structs


class InfoC(Structure):
    _fields_ = [("struct_size", c_size_t), ("version", c_uint32), ("abi_version", c_uint32),
                ("device_backend", c_char * 16), ("device_count", c_int32),
                ("transport", c_char * 16)]


class LayoutConfigC(Structure):
    _fields_ = [("struct_size", c_size_t), ("num_blocks", c_uint32), ("num_layers", c_uint32),
                ("outer_dim", c_uint32), ("page_size", c_uint32), ("inner_dim", c_uint32),
                ("dtype_width", c_uint32), ("layout_kind", c_int32), ("block_dim", c_int32)]


class LayoutHandleC(Structure):
    _fields_ = [("worker", c_uint64), ("layout", c_uint64)]


class WorkerConfigC(Structure):
    _fields_ = [("struct_size", c_size_t), ("device_id", c_int32), ("rank", c_int32),
                ("worker_id", c_uint64), ("disk_dir", c_char_p), ("object_dir", c_char_p),
                ("remote_deadline_ms", c_uint32), ("advertise_host", c_char_p),
                ("g3_persist_id", c_char_p)]


class BlockScopeC(Structure):
    _fields_ = [("struct_size", c_size_t), ("tiers", c_void_p), ("block_ids", c_void_p),
                ("num_blocks", c_size_t), ("expires_ms", c_uint32)]


class TransferOptionsC(Structure):
    _fields_ = [("struct_size", c_size_t), ("layer_start", c_uint32), ("layer_end", c_uint32),
                ("stream", c_void_p), ("precondition", c_void_p), ("deadline_ms", c_uint32),
                ("head_count", c_uint32), ("src_heads", c_uint32), ("src_head_first", c_uint32),
                ("src_head_order", c_uint32), ("dst_heads", c_uint32), ("dst_head_first", c_uint32),
                ("dst_head_order", c_uint32)]


class HandoffFactC(Structure):
    _fields_ = [("struct_size", c_size_t), ("kind", c_int32), ("handoff_id", c_uint8 * 16),
                ("timing_mode", c_int32), ("full_prompt_tokens", c_uint64),
                ("kv_bytes_per_token", c_uint64), ("has_kv_bytes_per_token", c_uint8),
                ("has_bandwidth_gbs", c_uint8), ("bandwidth_gbs", c_double),
                ("transferable_tokens", c_uint64)]


class HandoffActionC(Structure):
    _fields_ = [("id", c_uint64), ("kind", c_int32), ("completion", c_int32),
                ("delay_ms", c_double), ("handoff_id", c_uint8 * 16)]


ActionArray = HandoffActionC * KVBM_HANDOFF_MAX_ACTIONS

KVBM_PATH_COUNT = 9


class PathCountersC(Structure):
    _fields_ = [("transfers", c_uint64), ("blocks", c_uint64), ("bytes", c_uint64),
                ("failed_blocks", c_uint64), ("nanoseconds", c_uint64)]


class CountersC(Structure):
    _fields_ = [("struct_size", c_size_t), ("paths", PathCountersC * KVBM_PATH_COUNT)]


class CacheConfigC(Structure):
    _fields_ = [("struct_size", c_size_t), ("admit_after", c_uint32), ("g3_mode", c_int32),
                ("g4_mode", c_int32), ("max_events", c_uint32)]


class CacheTierStatsC(Structure):
    _fields_ = [(name, c_uint64) for name in (
        "capacity", "free", "registered", "pinned", "in_flight", "hits", "misses", "evictions",
        "stored", "removed")]


class CacheStatsC(Structure):
    _fields_ = [("struct_size", c_size_t), ("g2", CacheTierStatsC), ("g3", CacheTierStatsC)] + [
        (name, c_uint64) for name in (
            "g4_known", "g4_hits", "g4_misses", "g4_puts", "g4_put_failures", "g4_corrupt",
            "offloaded", "deduped", "not_admitted", "no_space", "offload_failed", "onboarded",
            "onboarded_from_g2", "onboarded_from_g3", "onboarded_from_g4", "onboard_failed",
            "written_down", "write_down_failed", "events_dropped", "g3_restored", "g3_refused")] + [
        ("load_rate", c_double * 5), ("load_queued", c_double * 5)]


class LoadPlanInputC(Structure):
    _fields_ = [("struct_size", c_size_t), ("block_bytes", c_double),
                ("tokens_per_block", c_uint32), ("prefill_tokens_per_s", c_double),
                ("margin", c_double), ("load_rate", c_double * 5), ("load_queued", c_double * 5)]


class CacheEventC(Structure):
    _fields_ = [("kind", c_int32), ("tier", c_int32), ("key_len", c_uint32),
                ("key", c_uint8 * KVBM_MAX_KEY_LEN)]

# ------------------------------------------------------------------ loading


def _candidates(package_dir: Optional[Path] = None) -> List[Path]:
    here = package_dir or Path(__file__).resolve().parent
    return [here / "libkvbm.so", here.parent.parent / "build" / "libkvbm.so"]


def find_library(package_dir: Optional[Path] = None) -> str:
    """The path of libkvbm.so: ``$KVBM_LIBRARY``, else the copy beside the
    package, else the checkout's ``build/libkvbm.so``. In a checkout (an
    editable install) where ``build/libkvbm.so`` is newer than the copy beside
    the package (``make lib`` without ``make py-lib``), the newer one. Raises
    ImportError if none exists."""
    env = os.environ.get("KVBM_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise ImportError(f"KVBM_LIBRARY={env!r} is not a file")
        return env
    found = [p for p in _candidates(package_dir) if p.is_file()]
    if not found:
        raise ImportError(
            "libkvbm.so not found: set KVBM_LIBRARY, or build it (make lib) and install the "
            "package (pip install ./python), looked in "
            + ", ".join(map(str, _candidates(package_dir))))
    if len(found) == 2 and found[1].stat().st_mtime > found[0].stat().st_mtime:
        return str(found[1])  # a stale copy beside the package
    return str(found[0])


def check_abi_version(reported: int, expected: int = ABI_VERSION, path: str = "") -> None:
    """Raises AbiMismatchError naming both versions unless reported == expected."""
    if reported != expected:
        where = f" ({path})" if path else ""
        raise AbiMismatchError(
            f"libkvbm{where} has ABI version {reported}, but kvbmgo was written for ABI "
            f"version {expected}; rebuild the library and the package from the same checkout")


# ---------------------------------------------------------------- errcheck

_last_error: Callable[[], bytes]


def _check_status(result: int, func: Any, args: Tuple[Any, ...]) -> int:
    """errcheck of status functions: raise on a negative status, on this thread."""
    if result < 0:
        raise error_class(result)(_last_error().decode("utf-8", "replace"), status=result,
                                  function=func.__name__)
    return result


# ------------------------------------------------------------------- table

_status = c_int32
_p = c_void_p  # handles, arrays passed as ctypes arrays or addresses
_S = "status"

#: name -> (restype, argtypes, errcheck). errcheck "status" means _check_status.
FUNCTIONS: Dict[str, Tuple[Any, List[Any], Optional[Any]]] = {
    "kvbm_version": (c_uint32, [], None),
    "kvbm_abi_version": (c_uint32, [], None),
    "kvbm_status_string": (c_char_p, [c_int32], None),
    "kvbm_last_error": (c_char_p, [], None),
    "kvbm_handle_count": (_status, [POINTER(c_size_t)], _S),
    "kvbm_info": (_status, [POINTER(InfoC)], _S),
    # streams and events
    "kvbm_stream_create": (_status, [c_int32, POINTER(c_void_p)], _S),
    "kvbm_stream_destroy": (_status, [_p], _S),
    "kvbm_stream_synchronize": (_status, [_p], _S),
    "kvbm_stream_wait_event": (_status, [_p, _p], _S),
    "kvbm_event_create": (_status, [c_int32, POINTER(c_void_p)], _S),
    "kvbm_event_destroy": (_status, [_p], _S),
    "kvbm_event_record": (_status, [_p, _p], _S),
    "kvbm_event_query": (_status, [_p], _S),
    "kvbm_event_synchronize": (_status, [_p], _S),
    # worker
    "kvbm_worker_create": (_status, [POINTER(WorkerConfigC), POINTER(c_void_p)], _S),
    "kvbm_worker_destroy": (_status, [_p], _S),
    "kvbm_worker_register_g1": (_status, [_p, POINTER(LayoutConfigC), _p, c_size_t,
                                          POINTER(LayoutHandleC)], _S),
    "kvbm_worker_unregister_g1": (_status, [_p, c_char_p], _S),
    "kvbm_worker_register_g2": (_status, [_p, POINTER(LayoutConfigC), _p, c_size_t,
                                          POINTER(LayoutHandleC)], _S),
    "kvbm_worker_register_g1_host": (_status, [_p, POINTER(LayoutConfigC), _p, c_size_t,
                                          POINTER(LayoutHandleC)], _S),
    "kvbm_worker_allocate_g2": (_status, [_p, POINTER(LayoutConfigC), POINTER(LayoutHandleC)], _S),
    "kvbm_worker_allocate_g3": (_status, [_p, POINTER(LayoutConfigC), POINTER(LayoutHandleC)], _S),
    "kvbm_worker_transfer": (_status, [_p, c_int32, _p, c_int32, _p, c_size_t,
                                       POINTER(TransferOptionsC), POINTER(c_void_p)], _S),
    "kvbm_worker_onboard_layerwise": (_status, [_p, _p, _p, c_size_t, _p, c_size_t, _p,
                                                POINTER(c_void_p)], _S),
    "kvbm_worker_export_metadata": (_status, [_p, _p, c_size_t, POINTER(c_size_t)], _S),
    "kvbm_worker_export_metadata_scoped": (_status, [_p, c_uint32, _p, c_size_t, POINTER(c_size_t)], _S),
    "kvbm_worker_export_metadata_blocks": (_status, [_p, POINTER(BlockScopeC), _p, c_size_t,
                                                     POINTER(c_size_t)], _S),
    "kvbm_worker_revoke_blocks": (_status, [_p, POINTER(BlockScopeC)], _S),
    "kvbm_worker_import_metadata": (_status, [_p, _p, c_size_t], _S),
    "kvbm_metadata_worker_id": (_status, [_p, c_size_t, POINTER(c_uint64)], _S),
    "kvbm_worker_disconnect_remote": (_status, [_p, c_uint64], _S),
    "kvbm_worker_connect_remote": (_status, [_p, c_uint64, _p, c_size_t], _S),
    "kvbm_worker_transfer_from_instance": (_status, [_p, c_uint64, c_int32, _p, c_int32, _p,
                                                     c_size_t, POINTER(TransferOptionsC),
                                                     POINTER(c_void_p)], _S),
    "kvbm_worker_transfer_from_remote": (_status, [_p, POINTER(LayoutHandleC), _p, c_int32, _p,
                                                   c_size_t, POINTER(TransferOptionsC),
                                                   POINTER(c_void_p)], _S),
    "kvbm_worker_transfer_to_remote": (_status, [_p, c_int32, _p, POINTER(LayoutHandleC), _p,
                                                 c_size_t, POINTER(TransferOptionsC),
                                                 POINTER(c_void_p)], _S),
    "kvbm_worker_counters": (_status, [_p, POINTER(CountersC)], _S),
    # object store
    "kvbm_worker_object_has": (_status, [_p, _p, _p, c_size_t, _p], _S),
    "kvbm_worker_object_put": (_status, [_p, _p, _p, c_size_t, c_int32, _p, _p], _S),
    "kvbm_worker_object_get": (_status, [_p, _p, _p, c_size_t, c_int32, _p, _p], _S),
    "kvbm_worker_onboard_objects": (_status, [_p, _p, _p, c_size_t, c_int32, _p,
                                              POINTER(c_void_p)], _S),
    "kvbm_worker_offload_objects": (_status, [_p, c_int32, _p, _p, _p, c_size_t,
                                              POINTER(c_void_p)], _S),
    # prefix cache
    "kvbm_worker_cache_enable": (_status, [_p, POINTER(CacheConfigC)], _S),
    "kvbm_worker_cache_match": (_status, [_p, _p, _p, c_size_t, POINTER(c_size_t), _p], _S),
    "kvbm_worker_cache_offload": (_status, [_p, _p, _p, c_size_t, _p, _p, _p,
                                            POINTER(c_void_p)], _S),
    "kvbm_worker_cache_onboard": (_status, [_p, _p, _p, c_size_t, _p, _p, c_size_t, _p,
                                            POINTER(c_void_p)], _S),
    "kvbm_worker_cache_stats": (_status, [_p, POINTER(CacheStatsC)], _S),
    "kvbm_load_plan": (_status, [POINTER(c_int32), c_size_t, POINTER(LoadPlanInputC),
                                 POINTER(c_size_t)], _S),
    "kvbm_worker_cache_events": (_status, [_p, POINTER(CacheEventC), c_size_t,
                                           POINTER(c_size_t)], _S),
    "kvbm_worker_cache_reset": (_status, [_p, POINTER(c_uint64), POINTER(c_uint64)], _S),
    # notification
    "kvbm_notification_poll": (_status, [_p], _S),
    "kvbm_notification_wait": (_status, [_p, ctypes.c_int64], _S),
    "kvbm_notification_failed_blocks": (_status, [_p, _p, c_size_t, POINTER(c_size_t)], _S),
    "kvbm_notification_cancel": (_status, [_p], _S),
    "kvbm_notification_free": (_status, [_p], _S),
    # coordinated worker
    "kvbm_coordinated_create": (_status, [_p, c_int32, c_uint64, POINTER(c_void_p)], _S),
    "kvbm_coordinated_destroy": (_status, [_p], _S),
    "kvbm_coordinated_set_local": (_status, [_p, c_int32, POINTER(LayoutHandleC)], _S),
    "kvbm_coordinated_apply_layout_response": (_status, [_p, _p, c_size_t], _S),
    "kvbm_coordinated_import_remote_metadata": (_status, [_p, c_uint64, c_int32, _p,
                                                          c_size_t], _S),
    "kvbm_coordinated_resolve_remote_handle": (_status, [_p, c_uint64, c_int32, c_int32,
                                                         POINTER(LayoutHandleC)], _S),
    "kvbm_coordinated_transfer_from_remote": (_status, [_p, c_uint64, c_int32, c_int32, _p,
                                                        c_int32, _p, c_size_t,
                                                        POINTER(TransferOptionsC),
                                                        POINTER(c_void_p)], _S),
    # handoff
    "kvbm_handoff_new": (_status, [_p, c_int32, c_double, POINTER(c_void_p)], _S),
    "kvbm_handoff_start": (_status, [_p, _p, c_size_t, POINTER(c_size_t)], _S),
    "kvbm_handoff_on_fact": (_status, [_p, POINTER(HandoffFactC), _p, c_size_t,
                                       POINTER(c_size_t)], _S),
    "kvbm_handoff_on_outcome": (_status, [_p, c_uint64, c_int32, c_char_p, _p, c_size_t,
                                          POINTER(c_size_t)], _S),
    "kvbm_handoff_is_complete": (_status, [_p, POINTER(c_int32)], _S),
    "kvbm_handoff_completion": (_status, [_p, POINTER(c_int32)], _S),
    "kvbm_handoff_free": (_status, [_p], _S),
}


#: Calls that never wait (they look up or free, in microseconds): made with
#: the GIL held (ctypes.PyDLL). Releasing and taking the GIL back around
#: each costs little alone, but with several Python threads every such call
#: becomes a hand-over of the GIL between them (a thread switch each).
#: Calls that can wait keep releasing it: notification_wait, synchronize,
#: connect, metadata import, I/O, and transfer (its first use of a device
#: loads the copy kernel and creates streams, on the real driver).
HOLD_GIL = frozenset({
    "kvbm_version", "kvbm_abi_version", "kvbm_status_string", "kvbm_last_error", "kvbm_handle_count",
    "kvbm_notification_poll", "kvbm_notification_free",
    "kvbm_notification_cancel", "kvbm_event_query", "kvbm_event_record",
})


class _Lib:
    """The loaded library: one attribute per function of FUNCTIONS."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.cdll = ctypes.CDLL(path)  # never dlclose()d: the Go runtime lives in-process
        self.pydll = ctypes.PyDLL(path)  # the same library, for the HOLD_GIL calls
        abi = self.cdll.kvbm_abi_version
        abi.restype, abi.argtypes = c_uint32, []
        # First the version: a mismatched library may lack functions of the table.
        check_abi_version(abi(), path=path)
        missing = []
        for name, (restype, argtypes, errcheck) in FUNCTIONS.items():
            try:
                fn = getattr(self.pydll if name in HOLD_GIL else self.cdll, name)
            except AttributeError:
                missing.append(name)
                continue
            fn.restype = restype
            fn.argtypes = argtypes
            if errcheck == _S:
                fn.errcheck = _check_status
            elif errcheck is not None:
                fn.errcheck = errcheck
            setattr(self, name, fn)
        if missing:
            raise ImportError(f"{path} lacks {', '.join(missing)}: an older libkvbm?")
        # poll without errcheck, for Notification.wait's first look (a done
        # transfer's wait is then one plain call): the caller checks the status.
        poll = self.pydll.kvbm_notification_poll
        poll = ctypes.cast(poll, type(poll))  # a function object of its own
        poll.restype, poll.argtypes = _status, [_p]
        self.kvbm_notification_poll_unchecked = poll


class _LazyLib:
    """:data:`lib`: the table's functions as attributes, loaded on the first
    attribute read. Loading is done once, under a lock: the first reader
    loads (finds the library, checks its ABI version, sets up the table),
    concurrent readers wait for it. A failed load raises ImportError (or
    AbiMismatchError) at that use and is tried again at the next. Once
    loaded, every attribute lives in the instance: no lookup costs more than
    a plain attribute read."""

    def __getattr__(self, name: str) -> Any:
        # Called only for a missing attribute: before the load, or a name
        # the library does not have.
        if name.startswith("__"):
            raise AttributeError(name)  # copy, pickle and friends probe these
        with _load_lock:
            if "cdll" not in self.__dict__:
                global _last_error
                loaded = _Lib(find_library())
                _last_error = loaded.kvbm_last_error
                self.__dict__.update(vars(loaded))
        try:
            return self.__dict__[name]
        except KeyError:
            raise AttributeError(f"libkvbm has no {name!r} in the table") from None

    @property
    def loaded(self) -> bool:
        """Whether the library is loaded in this process (never loads it)."""
        return "cdll" in self.__dict__


_load_lock = threading.Lock()

#: The library: ``lib.kvbm_worker_create(...)``, ``lib.path``. Loaded on first use.
lib: Any = _LazyLib()
