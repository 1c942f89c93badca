"""kvbmgo: Python bindings of libkvbm, a KV-cache block manager.

The library is found through ``$KVBM_LIBRARY``, else beside this package,
else in a checkout's ``build/`` (also when that one is newer than the copy
beside the package). ``import kvbmgo`` does not load it: it is loaded, and
its ABI version checked, on first use (the first object created or function
called), so a process may import kvbmgo and then fork; the child loads the
library when it first uses it. A child forked after the library was loaded
cannot use it (every call raises FailedPreconditionError): load it in the
child, or start children with the ``spawn`` method.

Integers passed to the library are checked against their C type: one that
does not fit raises InvalidArgumentError naming the argument, a bool or a
non-integer TypeError.
"""

from ._lib import ABI_VERSION, check_abi_version, find_library
from ._counters import PathCounters, TransferPath
from ._device import Event, Stream
from ._info import Info, handle_count, info, status_string, version
from ._layout import BlockDim, LayoutConfig, LayoutHandle, LayoutKind, Tier
from ._memory import Buffer, dense_span
from ._notification import Notification
from ._options import HeadSlice
from ._worker import Worker
from ._cache import (CacheEvent, CacheEventKind, CacheStats, CacheTierStats, Decision, PrefixCache,
                     WriteMode)
from ._coordinated import CoordinatedWorker
from ._loadplan import plan_load
from ._handoff import (Action, ActionKind, Completion, FactKind, HandoffCoordinator, HandoffOrder,
                       OutcomeKind, TimingMode)
from .errors import *  # noqa: F401,F403
from . import errors

__version__ = "0.1.0"

__all__ = [
    "ABI_VERSION", "check_abi_version", "find_library", "Action", "ActionKind", "Completion",
    "CoordinatedWorker", "Event", "FactKind", "HandoffCoordinator", "HandoffOrder", "Info",
    "LayoutHandle", "Notification", "OutcomeKind", "TransferPath", "PathCounters", "Stream", "Tier", "TimingMode", "Worker",
    "handle_count", "info", "status_string", "version", "BlockDim", "LayoutConfig",
    "LayoutKind", "__version__", "CacheEvent", "CacheEventKind", "CacheStats", "CacheTierStats",
    "Decision", "PrefixCache", "WriteMode", "Buffer", "dense_span", "HeadSlice", "plan_load",
] + list(errors.__all__)
