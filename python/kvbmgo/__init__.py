"""kvbmgo: Python bindings of libkvbm, a KV-cache block manager.

The library is found through ``$KVBM_LIBRARY``, else beside this package,
else in a checkout's ``build/`` (also when that one is newer than the copy
beside the package); its ABI version is checked at import.
"""

from ._lib import ABI_VERSION, check_abi_version, find_library
from ._core import (Action, ActionKind, Completion, CoordinatedWorker, Event, FactKind,
                    HandoffCoordinator, HandoffOrder, Info, LayoutHandle, Notification,
                    OutcomeKind, PathCounters, Stream, Tier, TimingMode, TransferPath, Worker, handle_count, info,
                    status_string, version)
from ._memory import BlockDim, LayoutConfig, LayoutKind
from .errors import *  # noqa: F401,F403
from . import errors

__version__ = "0.1.0"

__all__ = [
    "ABI_VERSION", "check_abi_version", "find_library", "Action", "ActionKind", "Completion",
    "CoordinatedWorker", "Event", "FactKind", "HandoffCoordinator", "HandoffOrder", "Info",
    "LayoutHandle", "Notification", "OutcomeKind", "TransferPath", "PathCounters", "Stream", "Tier", "TimingMode", "Worker",
    "handle_count", "info", "status_string", "version", "BlockDim", "LayoutConfig",
    "LayoutKind", "__version__",
] + list(errors.__all__)
