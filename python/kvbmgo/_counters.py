"""Per-path transfer counters of a worker (``kvbm_worker_counters``)."""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["TransferPath", "PathCounters"]


class TransferPath(enum.IntEnum):
    """KVBM_PATH_*: the paths blocks move along (keys of Worker.counters())."""
    HOST_COPY = 0   # host <-> host memcpy
    H2D = 1         # pinned -> device (layer-wise onboard too)
    D2H = 2         # device -> pinned
    D2D = 3         # device -> device
    DISK_WRITE = 4  # host -> disk
    DISK_READ = 5   # disk -> host
    TWO_HOP = 6     # disk <-> device, disk <-> disk, a peer <-> device or disk, via a bounce buffer
    REMOTE_READ = 7   # a peer's memory -> host, over the transport
    REMOTE_WRITE = 8  # host -> a peer's memory


class PathCounters(NamedTuple):
    """Totals of one path since the worker was created."""
    transfers: int      # completed transfers, failed or not
    blocks: int         # blocks those transfers moved or tried to
    bytes: int
    failed_blocks: int  # destination blocks reported failed
    nanoseconds: int    # time in flight, call to completion, summed
