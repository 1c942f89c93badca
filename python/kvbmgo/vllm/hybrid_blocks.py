"""Which blocks of a request a hybrid model's hit, load and store touch, per
KV cache group (groups.py says what each kind of group keeps): pure
functions of the request's hashes, its block tables and the index, for the
scheduler side (scheduler.py)."""

from __future__ import annotations

from typing import Any, Callable, Container, Iterable, List, Optional, Sequence, Tuple

from .groups import NULL_BLOCK, KvGroup, KvGroups

__all__ = ["match", "load", "store", "boundary_states"]

#: remember(key, parent key, block index): what a key's BlockStored event says.
Remember = Callable[[bytes, Optional[bytes], int], None]


def match(groups: KvGroups, hashes: Any, start: int, limit: int, tiers: Container[bytes],
          block_size: int) -> int:
    """The blocks after start tiers can restore in every kept group: the
    longest prefix every full-attention group holds, shortened until each
    sliding-window group holds the blocks vLLM keeps for it (those in the
    window of the hit's end) and each Mamba group the state at its end."""
    if groups.inert is not None:
        return 0
    limit = min(limit, groups.num_blocks(hashes))
    full = [g for g in groups.kept if g.kind == "full"]
    window = [g for g in groups.kept if g.kind == "window"]
    mamba = groups.mamba
    end = groups.held_run(hashes, start, limit, tiers, full)
    while end > start:
        missing = -1
        for g in window:
            for j in range(end - 1, max(start, g.first_kept_block(end * block_size)) - 1, -1):
                if groups.key(groups.block_hash(hashes, j), g) not in tiers:
                    missing = max(missing, j)
                    break
        if missing >= 0:
            end = missing  # a hit ending at or before the missing block
            continue
        h = groups.block_hash(hashes, end - 1)
        if any(groups.key(h, g) not in tiers for g in mamba):
            end -= 1  # no state at this boundary: an earlier one
            continue
        break
    return end - start


def load(groups: KvGroups, hashes: Any, tables: Any, start: int, nb: int
         ) -> Tuple[List[bytes], List[int], str]:
    """The keys and G1 blocks of a hit's load: each attention group's blocks
    after start that vLLM allocated (its nulls, a window's skipped blocks,
    are not loaded), and each Mamba group's state at the hit's end, into
    the block vLLM's align mode reads it from (the hit's last entry); and
    why it cannot be loaded, or "".

    That entry is a block vLLM 0.33 and 0.34 allocate for every async load
    (the scheduler allocates for the hit's tokens alone; hybrid loads are
    all async). Were it null, the state would have nowhere to go and vLLM
    would read the null block's: the load is refused (its request fails
    through failed_recving), never raised across the engine."""
    end = start + nb
    if not groups.mamba:  # attention groups only: every allocated block
        keys, ids = groups.block_keys(hashes, tables, start, end)
        return keys, ids, ""
    keys: List[bytes] = []
    ids: List[int] = []
    for j in range(start, end):
        h = groups.block_hash(hashes, j)
        for g in groups.kept:
            if g.kind == "mamba" and j != end - 1:
                continue
            b = tables[g.index][j]
            if b != NULL_BLOCK:
                keys.append(groups.key(h, g))
                ids.append(b)
            elif g.kind == "mamba":
                return [], [], (f"vLLM's table of Mamba group {g.index} holds no block for "
                                f"the state after {end} blocks (entry {j} is null)")
    return keys, ids, ""


def store(groups: KvGroups, hashes: Any, tables: Sequence[Sequence[int]], first: int,
          full: int, remember: Remember) -> Tuple[List[bytes], List[int]]:
    """The keys and G1 blocks of blocks first..full of a request whose
    tables (one per kept group, in groups.kept's order) are given: every
    attention group's that is not null. They are offered in the step that
    computes them: a sliding-window block vLLM frees later (and hands to
    another request) was read by then, or is waited for (allocated).
    Mamba states are not here: vLLM names their blocks (boundary_states)."""
    keys: List[bytes] = []
    ids: List[int] = []
    if groups.inert is not None:
        return keys, ids
    for i in range(first, full):
        h = groups.block_hash(hashes, i)
        parent = groups.block_hash(hashes, i - 1) if i > 0 else None
        for table, g in zip(tables, groups.kept):
            if g.kind == "mamba":
                continue
            b = table[i] if i < len(table) else NULL_BLOCK
            if b == NULL_BLOCK:
                continue
            k = groups.key(h, g)
            keys.append(k)
            ids.append(b)
            remember(k, None if parent is None else groups.key(parent, g), i)
    return keys, ids


def boundary_states(groups: KvGroups, hashes: Any, offers: Iterable[Tuple[int, int, int]],
                    block_size: int, remember: Remember) -> Tuple[List[bytes], List[int]]:
    """The keys and G1 blocks of the Mamba states vLLM offers a request this
    step (its boundary_state_offloads: (group, block, tokens)): each one
    after a whole number of blocks whose hash is known, of a kept Mamba
    group, stored under that prefix's hash. vLLM's forward of this step
    writes it; the store reads it after (wait_for_save), before vLLM may
    free the block. A partial block's state (a sub-block hit's) is not
    kept: hits are whole blocks."""
    keys: List[bytes] = []
    ids: List[int] = []
    if groups.inert is not None:
        return keys, ids
    known = groups.num_blocks(hashes)
    for index, block, tokens in offers:
        g: Optional[KvGroup] = groups.group(int(index))
        if g is None or g.kind != "mamba" or block == NULL_BLOCK or tokens <= 0 \
                or tokens % block_size or tokens // block_size > known:
            continue
        i = tokens // block_size - 1
        k = groups.key(groups.block_hash(hashes, i), g)
        keys.append(k)
        ids.append(int(block))
        remember(k, groups.key(groups.block_hash(hashes, i - 1), g) if i > 0 else None, i)
    return keys, ids
