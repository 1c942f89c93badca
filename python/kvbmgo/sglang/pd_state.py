"""The extra state buffers of a hybrid model (``KVArgs.state_types``,
``state_data_ptrs``, ``state_data_lens``, ``state_item_lens``) in kvbm's
SGLang PD backend: which kinds move, their layout, and how a room's state
slots go from the prefill's memory to the decode's.

Each state component SGLang hands over is a list of buffers, each an array
of slots of ``item_len`` bytes (slot i at ``ptr + i * item_len``: a Mamba
pool slot of one layer's conv or temporal state, a page of one layer of the
sliding-window pool, ...), and each room names, with its last chunk, the
slots it owns in every component (``state_indices``, in ``state_types``
order; the decode names its own in ``send_metadata``), paired by position.
That is the KV pool's shape: the buffers of a component are grouped by
(slots, slot bytes) and each group registered, unchanged, as one more kvbm
worker's G1 (a buffer a "layer", a slot a block). The prefill gives out,
with the last KVBM_PULL, metadata of each such worker scoped to the room's
slots, revoked with the room's pages; the decode pulls the slots with its
own workers under the hand-off that pulls the pages, so a state is awaited,
bounded and canceled as they are, and Success is reported after both.

Moved: the kinds in MOVED. Refused (REFUSED, and any kind SGLang adds
later): a room that carries slots of one fails with the reason on both
sides; the manager says so once when it is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from sglang.srt.disaggregation.base.conn import StateType

from . import pd_wire as wire

__all__ = ["MOVED", "REFUSED", "StateComponent", "state_components", "room_slots",
           "StateScope"]

#: Slot-indexed kinds paired position by position, the KV pages' kind of
#: thing: Mamba (one pool slot a request), the sliding-window pool (its
#: pages of the window), the block scales of an MXFP8 pool and of its SWA
#: sub-pool (the KV's pages), and a request row (one row a request).
MOVED = frozenset({StateType.MAMBA, StateType.SWA, StateType.BLOCK_SCALE,
                   StateType.BLOCK_SCALE_SWA, StateType.REQUEST_ROW})

#: Kinds SGLang 0.5.23 defines that kvbm does not move: DSA (entries elided
#: on one side, page-sharded owners), DSA_TAIL (a live subrange of a ring
#: row), QSA_* and MINIMAX_* (layer-id pairing, draft remapping), SWA_RING
#: and DSV4_REQUEST_STATE (DeepSeek-V4's heterogeneous layouts): none of
#: them tested here.
REFUSED = frozenset(set(StateType) - MOVED)

#: Kinds whose slot lists hold exactly one slot (SGLang's own assumption).
_ONE_SLOT = frozenset({StateType.MAMBA, StateType.REQUEST_ROW})


def _kind_name(kind: Any) -> str:
    return str(getattr(kind, "value", kind))


@dataclass(frozen=True)
class StateComponent:
    """One entry of KVArgs.state_types: its kind and, when moved, the
    groups of its buffers (wire.KVGroup, buffers indexing its state_data_ptrs)."""
    index: int
    kind: Any
    groups: Tuple[wire.KVGroup, ...]

    @property
    def moved(self) -> bool:
        return self.kind in MOVED

    @property
    def name(self) -> str:
        return f"state {self.index} ({_kind_name(self.kind)})"


def state_components(args: Any) -> List[StateComponent]:
    """KVArgs' state components, in order. Raises ValueError for lists that
    disagree or a moved component's bad buffer."""
    kinds = list(getattr(args, "state_types", None) or [])
    ptrs = list(getattr(args, "state_data_ptrs", None) or [])
    lens = list(getattr(args, "state_data_lens", None) or [])
    items = list(getattr(args, "state_item_lens", None) or [])
    if not (len(kinds) == len(ptrs) == len(lens) == len(items)):
        raise ValueError(f"{wire.LABEL}: {len(kinds)} state types, {len(ptrs)} pointer "
                         f"lists, {len(lens)} length lists, {len(items)} item length lists")
    out = []
    for i, kind in enumerate(kinds):
        if len(ptrs[i]) != len(lens[i]) or len(lens[i]) != len(items[i]):
            raise ValueError(f"{wire.LABEL}: state {i} ({_kind_name(kind)}) has "
                             f"{len(ptrs[i])} buffers, {len(lens[i])} lengths, "
                             f"{len(items[i])} item lengths")
        groups: Tuple[wire.KVGroup, ...] = ()
        if kind in MOVED and ptrs[i]:
            groups = tuple(wire.kv_groups(lens[i], items[i],
                                          what=f"state {i} ({_kind_name(kind)})"))
        out.append(StateComponent(i, kind, groups))
    return out


def signature(components: Sequence[StateComponent]) -> list:
    """The part of the layouts' signature both sides must agree on."""
    return [[_kind_name(c.kind), [[list(g.buffers), g.item_len] for g in c.groups]]
            for c in components]


def room_slots(components: Sequence[StateComponent],
               state_indices: Optional[Sequence[Any]]) -> List[np.ndarray]:
    """A room's slots per component (int32, empty where it has none) from
    SGLang's state_indices. Raises ValueError, the reason a room fails: a
    refused kind with slots, a list of another length, a one-slot kind
    with another count, a negative slot."""
    given = list(state_indices or [])
    if given and len(given) != len(components):
        raise ValueError(f"{wire.LABEL}: {len(given)} state index lists for "
                         f"{len(components)} state components")
    out = []
    for i, c in enumerate(components):
        s = given[i] if i < len(given) else None
        slots = np.zeros(0, np.int32) if s is None else \
            np.ascontiguousarray(np.asarray(s, dtype=np.int64).reshape(-1))
        if len(slots) and not c.moved:
            raise ValueError(f"{wire.LABEL}: {c.name} cannot be transferred (kvbm moves "
                             f"{sorted(_kind_name(k) for k in MOVED)})")
        if len(slots) and not c.groups:
            raise ValueError(f"{wire.LABEL}: {c.name} names slots but has no buffers")
        if c.kind in _ONE_SLOT and s is not None and len(slots) != 1:
            raise ValueError(f"{wire.LABEL}: {c.name} needs one slot a request, got "
                             f"{len(slots)}")
        if len(slots) and (slots.min() < 0 or slots.max() > np.iinfo(np.int32).max):
            raise ValueError(f"{wire.LABEL}: {c.name}: slot out of range in "
                             f"{slots[:8].tolist()}")
        out.append(slots.astype(np.int32))
    return out


#: One component's slots as a KVBM_PULL carries them: the component's
#: index, the prefill's slots, and the metadata of each of its workers
#: scoped to those slots.
StateScope = Tuple[int, np.ndarray, List[bytes]]


def refused_note(components: Sequence[StateComponent]) -> Optional[str]:
    """The line a manager logs once when SGLang hands it refused kinds."""
    refused = [c.name for c in components if not c.moved]
    if not refused:
        return None
    return (f"{wire.LABEL}: {', '.join(refused)} cannot be transferred; a request that "
            f"names slots in them fails with the reason")


def check_pair(c: StateComponent, src: np.ndarray, dst: np.ndarray) -> Optional[str]:
    """Why the prefill's slots src cannot go into the decode's dst, or None."""
    if len(src) != len(dst):
        return (f"{c.name}: the prefill sent {len(src)} slots, this decode reserved "
                f"{len(dst)}")
    return None


def by_component(scopes: Sequence[StateScope]) -> Dict[int, StateScope]:
    return {s[0]: s for s in scopes}
