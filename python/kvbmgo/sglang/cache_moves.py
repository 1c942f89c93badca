"""Saving and loading pages through one kvbm worker's prefix cache, by G1
block: what every host pool of the HiCache backend does (the KV pool of v1,
and each pool part of v2), with the same rules: kvbm refuses a key twice in
one call, and a call never takes more pages than G2 holds."""

from __future__ import annotations

import logging
from typing import Any, List

from .._cache import Decision
from ..errors import KvbmError

__all__ = ["save_blocks", "load_blocks"]

logger = logging.getLogger("kvbmgo.sglang.hicache")


def _rounds(keys: List[bytes]) -> List[List[int]]:
    """Indices of keys split into rounds without a repeated key; almost
    always one round."""
    rounds: List[List[int]] = []
    seen: List[set] = []
    for i, k in enumerate(keys):
        for r, s in zip(rounds, seen):
            if k not in s:
                r.append(i)
                s.add(k)
                break
        else:
            rounds.append([i])
            seen.append({k})
    return rounds


def chunks(idx: List[int], size: int) -> List[List[int]]:
    return [idx[i:i + size] for i in range(0, len(idx), size)]


def save_blocks(cache: Any, g2_pages: int, keys: List[bytes], ids: List[int],
                what: str = "pages") -> List[bool]:
    """Saves G1 blocks ids under keys; True per block stored or present."""
    ok = [False] * len(keys)
    for rnd in _rounds(keys):
        for chunk in chunks(rnd, g2_pages):
            ck, ci = [keys[i] for i in chunk], [ids[i] for i in chunk]
            try:
                n, decisions = cache.offload(ck, ci)
            except KvbmError as e:
                logger.warning("kvbm HiCache storage: offload of %d %s refused: %s",
                               len(ck), what, e)
                continue
            failed = wait_failed(n, ci, logger.warning, f"{what} not saved")
            for i, b, d in zip(chunk, ci, decisions):
                ok[i] = (d in (Decision.PRESENT, Decision.IN_FLIGHT) or
                         (d == Decision.STORE and b not in failed))
    return ok


def load_blocks(cache: Any, g2_pages: int, keys: List[bytes], ids: List[int],
                what: str = "pages") -> List[bool]:
    """Loads keys into G1 blocks ids; True per block loaded, never for one
    that failed (missing, corrupt, a failed copy)."""
    ok = [False] * len(keys)
    for rnd in _rounds(keys):
        for chunk in chunks(rnd, g2_pages):
            ck, ci = [keys[i] for i in chunk], [ids[i] for i in chunk]
            try:
                n = cache.onboard(ck, ci)
            except KvbmError as e:
                logger.warning("kvbm HiCache storage: load of %d %s refused: %s",
                               len(ck), what, e)
                continue
            failed = wait_failed(n, ci, logger.info, f"{what} not loaded")
            for i, b in zip(chunk, ci):
                ok[i] = b not in failed
    return ok


def wait_failed(n: Any, ids: List[int], log: Any, what: str) -> set:
    """Waits for (and closes) notification n over G1 blocks ids and returns
    the blocks that failed: all of them when it names none."""
    with n:
        try:
            n.wait(None)
        except KvbmError as e:
            failed = set(n.failed_blocks()) or set(ids)
            log("kvbm HiCache storage: %d of %d %s: %s", len(failed), len(ids), what, e)
            return failed
    return set()
