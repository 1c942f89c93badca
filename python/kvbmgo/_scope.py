"""kvbm_block_scope_t from a {tier: block ids} mapping: what
Worker.export_metadata(blocks=...) covers and Worker.revoke_blocks ends."""

from __future__ import annotations

import ctypes
from ctypes import c_int32, c_void_p, sizeof
from typing import Any, List, Mapping, Optional

from . import _lib
from ._cint import Ids, block_ids, int32, millis

__all__ = ["block_scope"]


def block_scope(blocks: Mapping[int, Ids], expires: Optional[float] = None) -> Any:
    """The C struct naming blocks ({Tier.G1: ids, ...}), until expires
    seconds from now when given. Its arrays stay alive with it."""
    tiers: List[int] = []
    ids: List[int] = []
    for tier, tier_ids in blocks.items():
        owner, addr, n = block_ids(tier_ids, "blocks")
        tiers.extend([int32(tier, "tier")] * n)
        ids.extend((ctypes.c_uint32 * n).from_address(addr) if n else [])
        del owner
    scope = _lib.BlockScopeC()
    scope.struct_size = sizeof(scope)
    scope._arrays = ((c_int32 * len(tiers))(*tiers), (ctypes.c_uint32 * len(ids))(*ids))
    scope.tiers = ctypes.cast(scope._arrays[0], c_void_p) if tiers else None
    scope.block_ids = ctypes.cast(scope._arrays[1], c_void_p) if ids else None
    scope.num_blocks = len(ids)
    if expires is not None:
        scope.expires_ms = millis(expires, "expires")
    return scope
