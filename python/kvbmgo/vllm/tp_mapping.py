"""Heterogeneous tensor parallelism for P/D: which prefill ranks a decode
rank reads, and which of their KV heads fill which of its own.

It follows vLLM's NixlConnector (``nixl/tp_mapping.py``:
``compute_tp_mapping``, ``compute_head_offset``; ``TransferTopology``):

- MHA/GQA, prefill TP p = k*d: decode rank r gathers its heads from
  prefill ranks r*k .. r*k+k-1, each filling a slice of its heads.
- MHA/GQA, decode TP d = k*p: decode rank r reads its slice of the heads of
  prefill rank r // k; k decode ranks read each prefill rank, which lets go
  once all k said done (NixlConnector's ``expected_consumers``).
- KV heads fewer than the TP size: vLLM replicates them (rank r of tp holds
  head r*H//tp); with p > d a head is read from the first prefill rank that
  holds it (NixlConnector's GQA dedup), the other ranks of the group are
  only told done (NixlConnector refuses this case; the mapping is the same).
- MLA: every rank holds the whole (latent) KV; decode rank r reads prefill
  rank r*p//d, any p and d.

Every other pair is refused (``refusal``). Pure Python: no torch, no
library, no vllm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

__all__ = ["Read", "Plan", "kv_heads", "refusal", "plan", "owned"]


@dataclass(frozen=True)
class Read:
    """Prefill rank ``rank``'s local KV heads ``src`` ([start, end)) fill
    this decode rank's local heads ``dst`` (as long)."""
    rank: int
    src: Tuple[int, int]
    dst: Tuple[int, int]


@dataclass(frozen=True)
class Plan:
    """One decode rank's part of a hand-over: its reads; the prefill ranks
    it tells done (those it reads and those it answers for); and, per such
    rank, how many decode ranks tell it done (it lets go after them all)."""
    reads: Tuple[Read, ...]
    notify: Tuple[int, ...]
    consumers: Dict[int, int]


def kv_heads(rank: int, tp: int, total: int, mla: bool) -> Tuple[int, int]:
    """The global KV heads [start, end) rank of tp holds, as vLLM shards
    them: total/tp each, or one (replicated) when tp > total; MLA: the one
    latent "head", on every rank."""
    if mla:
        return 0, 1
    if tp <= total:
        n = total // tp
        return rank * n, rank * n + n
    g = rank * total // tp
    return g, g + 1


def refusal(p: int, d: int, total: int, mla: bool) -> Optional[str]:
    """Why a decode of TP d cannot pull from a prefill of TP p (total KV
    heads, MLA or not); None when it can."""
    if p < 1 or d < 1:
        return f"tensor-parallel sizes must be >= 1 (prefill {p}, decode {d})"
    if mla:
        return None  # the KV is replicated: any rank's copy is every rank's
    if total < 1:
        return (f"the prefill has tensor-parallel size {p}, this decode {d}, and the model's "
                f"number of KV heads is unknown: heads cannot be mapped between the sizes")
    if p % d and d % p:
        return (f"the prefill has tensor-parallel size {p}, this decode {d}: kvbm maps KV "
                f"heads between sizes one of which divides the other (p = k*d or d = k*p), "
                f"as NixlConnector does")
    for who, tp in (("prefill", p), ("decode", d)):
        if total % tp and tp % total:
            return (f"the {who}'s tensor-parallel size {tp} neither divides the model's "
                    f"{total} KV heads nor is a multiple of them (prefill {p}, decode {d})")
    return None


def owned(rank: int, d: int, p: int) -> List[int]:
    """The prefill ranks decode rank ``rank`` answers for: it tells them
    done even when it reads none of their blocks, so every prefill rank
    hears from at least one decode rank."""
    return [q for q in range(p) if q * d // p == rank]


def _reads(rank: int, d: int, p: int, total: int, mla: bool) -> Tuple[Read, ...]:
    if mla:
        return (Read(rank * p // d, (0, 1), (0, 1)),)
    a, b = kv_heads(rank, d, total, mla)
    if d >= p:
        # One prefill rank holds every head of this rank: NixlConnector's
        # r*p//d (with replicated heads too, so the reads spread over ranks).
        q = rank * p // d
        q0 = kv_heads(q, p, total, mla)[0]
        return (Read(q, (a - q0, b - q0), (0, b - a)),)
    reads: List[Read] = []
    for g in range(a, b):
        # The first prefill rank holding global head g.
        q = g // (total // p) if p <= total else -(-g * p // total)
        q0 = kv_heads(q, p, total, mla)[0]
        last = reads[-1] if reads else None
        if last is not None and last.rank == q and last.dst[1] == g - a:
            reads[-1] = Read(q, (last.src[0], g - q0 + 1), (last.dst[0], g - a + 1))
        else:
            reads.append(Read(q, (g - q0, g - q0 + 1), (g - a, g - a + 1)))
    return tuple(reads)


def _notify(rank: int, d: int, p: int, total: int, mla: bool) -> Tuple[int, ...]:
    return tuple(sorted({r.rank for r in _reads(rank, d, p, total, mla)} | set(owned(rank, d, p))))


def plan(rank: int, d: int, p: int, total: int, mla: bool) -> Plan:
    """Decode rank ``rank`` of TP d pulling from a prefill of TP p. Raises
    ValueError with ``refusal``'s message for a pair that cannot be mapped."""
    why = refusal(p, d, total, mla)
    if why is not None:
        raise ValueError(why)
    if not 0 <= rank < d:
        raise ValueError(f"decode rank {rank} is not within tensor-parallel size {d}")
    notify = _notify(rank, d, p, total, mla)
    consumers = {q: 0 for q in notify}
    for r in range(d):
        for q in _notify(r, d, p, total, mla):
            if q in consumers:
                consumers[q] += 1
    return Plan(_reads(rank, d, p, total, mla), notify, consumers)
