"""vLLM's KV cache groups as the connector keeps them, with vLLM's hybrid KV
cache manager (HMA) on.

A model whose layers differ in attention (full beside sliding-window, or
Mamba / linear attention beside attention) has one KV cache group per kind.
Groups alias the same memory: block b of group g is page b of g's layers, and
a block id belongs to one group at a time. So kvbm registers G1 once, over
the distinct pages (kv_views.g1_layout: aliasing layers are one kvbm layer),
and a kvbm block is one vLLM block of whichever group owns it; what makes a
group's bytes its own is the key: the block hash tagged with the group.

Kept groups:
- full attention: every block of the prefix;
- sliding window: the blocks vLLM keeps for a hit (those not null once the
  hit is computed), each stored in the step that computes it, before vLLM can
  free and reuse its id;
- Mamba / linear attention in vLLM's "align" cache mode: the state after a
  whole number of blocks, stored from the exact block vLLM names for it
  (boundary_state_offloads) under the hash of the prefix it ends, and loaded
  into the block vLLM's align mode reads the state of a hit's end from (its
  table entry for the hit's last block). A hit ends only where every Mamba
  group holds that state.
A prefix-cacheable group of another kind (chunked local attention, Mamba
outside align mode, ...) cannot be restored at a block boundary: with one,
the connector stores and loads nothing (one warning names the group), since
a hit would leave that group's state wrong. Groups that are not
prefix-cacheable are not the connector's (vLLM's own prefix cache skips them
too).

A model with one group is not hybrid: keys are vLLM's block hashes as they
are, as before HMA.

Imports neither vllm nor torch: specs are classified by their class name.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from itertools import islice
from typing import Any, Container, FrozenSet, List, Optional, Sequence, Tuple

__all__ = ["KvGroup", "KvGroups", "NULL_BLOCK"]

log = logging.getLogger(__name__)

#: vLLM's null block (BlockPool's first block): the table's entry for a
#: sliding window's skipped blocks (and Mamba's interior ones). Never stored
#: or loaded.
NULL_BLOCK = 0

#: Spec classes (and those derived from them) kept, by their kind.
_FULL = ("FullAttentionSpec", "MLAAttentionSpec")
_WINDOW = ("SlidingWindowSpec", "SlidingWindowMLASpec")
#: Mamba / linear attention (GDN, short conv, ... all use vLLM's MambaSpec).
_MAMBA = ("MambaSpec",)

#: A hybrid key is the block hash, then this tag and the group (3 digits).
_TAG = b"/g"


@dataclass(frozen=True)
class KvGroup:
    """A kept KV cache group: its index among vLLM's groups, kind ("full",
    "window" or "mamba"), tokens per block, and for a sliding window the tokens it
    attends back (window) and the trailing ones vLLM retains beyond it."""
    index: int
    kind: str
    block_size: int
    window: int = 0
    retained: int = 0
    #: vLLM's name of its spec's kind (KV events' kv_cache_spec_kind).
    spec_kind: Optional[str] = None

    def first_kept_block(self, tokens: int) -> int:
        """The first block vLLM keeps (not null) for a request with tokens
        computed: vLLM's sliding-window manager nulls every block wholly
        before the window of the next token (get_num_skipped_tokens)."""
        if self.kind != "window":
            return 0
        return max(0, tokens - self.window + 1 - self.retained) // self.block_size


def _kind(spec: Any) -> Optional[str]:
    """full / window / mamba for a spec the connector keeps, else None."""
    specs = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs
    if isinstance(specs, dict) and specs:
        kinds = {_kind(s) for s in specs.values()}
        return "full" if kinds == {"full"} else None
    name = type(spec).__name__
    if name in _FULL:
        return "full"
    if name in _WINDOW:
        return "window"
    if name in _MAMBA and getattr(spec, "mamba_cache_mode", None) == "align":
        return "mamba"
    return None


def _why_not(spec: Any) -> str:
    """Why a prefix-cacheable group's spec is not kept."""
    if type(spec).__name__ in _MAMBA:
        return (f"its mamba_cache_mode is {getattr(spec, 'mamba_cache_mode', None)!r}: kvbm "
                f"keeps Mamba states in vLLM's 'align' mode, where they sit at block "
                f"boundaries (--mamba-cache-mode align)")
    return "kvbm cannot restore this kind of group at a block boundary"


def _window(spec: Any) -> Tuple[int, int]:
    return int(getattr(spec, "sliding_window", 0) or 0), \
        int(getattr(spec, "extra_retained_tokens", 0) or 0)


def _spec_kind(spec: Any) -> Optional[str]:
    try:
        from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind
        return str(get_kv_cache_spec_kind(spec).value)
    except Exception:  # noqa: BLE001 - a vLLM without it: events name no kind
        return None


def _describe(index: int, group: Any) -> str:
    names = list(getattr(group, "layer_names", ()) or ())
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"KV cache group {index} ({type(group.kv_cache_spec).__name__}: {shown})"


@dataclass(frozen=True)
class KvGroups:
    """The groups of one engine as the connector keeps them."""
    #: The kept groups, in vLLM's order.
    kept: Tuple[KvGroup, ...]
    #: vLLM's group count (1: not hybrid).
    num_groups: int
    #: Tokens per block of every kept group.
    block_size: int
    #: Request block hashes per block (hash_block_size divides block_size).
    hashes_per_block: int = 1
    #: Why nothing is stored or loaded (a group kvbm cannot keep); None: kept.
    inert: Optional[str] = None
    #: The layers of the kept groups (None: every layer), for G1.
    layer_names: Optional[FrozenSet[str]] = None
    #: (group index, its kind, its layers) of every kept group, for messages.
    layout: Tuple[Tuple[int, str, Tuple[str, ...]], ...] = ()
    #: vLLM zeroes the blocks it hands out (models with Mamba layers) when a
    #: step starts, before the connector hears of the step: no store may
    #: read G1 past the step that offered it.
    zeroed: bool = False
    #: vLLM's KV cache blocks (0: not known): what every G1 view must count.
    g1_blocks: int = 0

    @property
    def hybrid(self) -> bool:
        return self.num_groups > 1

    @property
    def mamba(self) -> Tuple[KvGroup, ...]:
        """The kept Mamba groups (states at block boundaries)."""
        return tuple(g for g in self.kept if g.kind == "mamba")

    @classmethod
    def single(cls, block_size: int) -> "KvGroups":
        return cls((KvGroup(0, "full", block_size),), 1, block_size)

    @classmethod
    def from_config(cls, kv_cache_config: Any, block_size: int) -> "KvGroups":
        """From vLLM's KVCacheConfig (None or one group: not hybrid)."""
        groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
        g1_blocks = int(getattr(kv_cache_config, "num_blocks", 0) or 0)
        if len(groups) <= 1:
            return dataclasses.replace(cls.single(block_size), g1_blocks=g1_blocks)
        ids = getattr(kv_cache_config, "prefix_cacheable_group_ids", None)
        ids = range(len(groups)) if ids is None else ids
        kept: List[KvGroup] = []
        refused: List[str] = []
        for i in ids:
            spec = groups[i].kv_cache_spec
            kind = _kind(spec)
            if kind is None:
                refused.append(f"{_describe(i, groups[i])}: {_why_not(spec)}")
                continue
            window, retained = _window(spec) if kind == "window" else (0, 0)
            kept.append(KvGroup(int(i), kind, int(spec.block_size), window, retained,
                                _spec_kind(spec)))
        layers = frozenset(n for g in kept for n in groups[g.index].layer_names)
        sizes = sorted({g.block_size for g in kept})
        bs = sizes[0] if sizes else block_size
        hbs = int(getattr(kv_cache_config, "hash_block_size", None) or bs)
        inert = None
        if refused:
            inert = (f"{'; '.join(refused)}; a hit without it would leave that group's "
                     f"state wrong")
        elif not kept:
            inert = "no KV cache group is prefix-cacheable"
        elif len(sizes) > 1:
            inert = (f"the kept KV cache groups have block sizes {sizes} tokens; kvbm keeps "
                     f"groups of one block size")
        elif bs % hbs:
            inert = f"the block hashes cover {hbs} tokens, which does not divide {bs}"
        layout = tuple((g.index, g.kind, tuple(groups[g.index].layer_names)) for g in kept)
        zeroed = getattr(kv_cache_config, "needs_kv_cache_zeroing", None)
        if zeroed is None:  # a vLLM before it: Mamba layers are why it zeroes
            zeroed = any(_kind(g.kv_cache_spec) == "mamba" for g in groups)
        return cls(tuple(kept), len(groups), bs, max(1, bs // hbs), inert, layers, layout,
                   bool(zeroed), g1_blocks)

    def shapes(self, views: Any) -> str:
        """Each kept group's KV view shape and dtype (its first layer's),
        for a G1 that cannot be registered."""
        out = []
        for index, kind, names in self.layout:
            v = views.get(names[0]) if names else None
            what = "no view" if v is None else f"{tuple(v.shape)} {v.dtype}"
            out.append(f"group {index} ({kind}, {len(names)} layers): {what}")
        return "; ".join(out)

    def warn_inert(self) -> None:
        """Says once, naming the group, why the connector keeps nothing."""
        if self.inert is not None:
            log.warning("kvbm: the connector stores and loads no KV for this model (no "
                        "external hit is claimed): %s", self.inert)

    # ---- keys

    def block_hash(self, hashes: Sequence[Any], j: int) -> bytes:
        """The hash of block j (its last hash block: vLLM's hashes chain, so
        it names the whole prefix)."""
        return bytes(hashes[(j + 1) * self.hashes_per_block - 1])

    def num_blocks(self, hashes: Sequence[Any]) -> int:
        """The blocks whose hash is known."""
        return len(hashes) // self.hashes_per_block

    def key(self, block_hash: bytes, group: KvGroup) -> bytes:
        """The cache key of group's block with block_hash: the hash itself
        when not hybrid, else tagged with the group (kvbm keys are at most
        64 bytes: vLLM's are 32)."""
        if not self.hybrid:
            return block_hash
        return block_hash + _TAG + b"%03d" % group.index

    def split(self, key: bytes) -> Tuple[bytes, Optional[int]]:
        """(block hash, group index) of a key (None: not hybrid)."""
        if self.hybrid and len(key) > 5 and key[-5:-3] == _TAG and key[-3:].isdigit():
            return key[:-5], int(key[-3:])
        return key, None

    def group(self, index: int) -> Optional[KvGroup]:
        """The kept group of vLLM's index (None: not kept)."""
        for g in self.kept:
            if g.index == index:
                return g
        return None

    def event_fields(self, index: Optional[int]) -> dict:
        """What vLLM's BlockStored says of a block's group (hybrid only)."""
        g = None if index is None else self.group(index)
        if g is None:
            return {}
        return {"group_idx": g.index, "kv_cache_spec_kind": g.spec_kind,
                "kv_cache_spec_sliding_window": g.window if g.kind == "window" else None}

    # ---- keys in bulk: the scheduler's loops over a request's blocks (a
    # 32k-token request has 2,048), without a call per block and group

    def tag(self, group: KvGroup) -> bytes:
        """What key appends to a block hash for group."""
        return _TAG + b"%03d" % group.index if self.hybrid else b""

    def held_run(self, hashes: Sequence[Any], start: int, limit: int,
                 tiers: Container[bytes], groups: Sequence[KvGroup]) -> int:
        """The end of the run of blocks from start (before limit) whose key
        tiers holds in every one of groups."""
        tags = [self.tag(g) for g in groups]
        hpb = self.hashes_per_block
        end = start
        # vLLM's BlockHash is bytes at run time: joined as it is.
        run = islice(hashes, (start + 1) * hpb - 1, limit * hpb, hpb)
        if len(tags) == 1:  # one full-attention group: the usual hybrid
            t = tags[0]
            for h in run:
                if h + t not in tiers:
                    break
                end += 1
            return end
        for h in run:
            for t in tags:
                if h + t not in tiers:
                    return end
            end += 1
        return end

    def block_keys(self, hashes: Sequence[Any], tables: Sequence[Sequence[int]], start: int,
                   stop: int) -> Tuple[List[bytes], List[int]]:
        """The keys and G1 blocks of blocks start..stop of every kept group
        whose table entry (tables: one per vLLM group) is not null, block
        by block."""
        cols = [(self.tag(g), tables[g.index]) for g in self.kept]
        hpb = self.hashes_per_block
        keys: List[bytes] = []
        ids: List[int] = []
        j = start
        for h in islice(hashes, (start + 1) * hpb - 1, stop * hpb, hpb):
            for t, table in cols:
                b = table[j]
                if b != NULL_BLOCK:
                    keys.append(h + t)
                    ids.append(b)
            j += 1
        return keys, ids
