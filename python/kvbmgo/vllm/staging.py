"""A worker's own KV, as heterogeneous-TP P/D sees it (``LocalKv``: which
heads its G1 views hold and in which order, described to the peer), and the
decode's staging area for a pull that takes part of a prefill rank's block,
or fills part of its own (``Staging``).

Why a staging area: a head slice of a block is not one byte range the
library could pull. vLLM 0.33's view of a layer is ``[block, head, token,
2*head_size]``; under LBHNC/BLHNC (heads outermost in a block) a slice is one
range per (block, layer), but under LBNHC/BLNHC (tokens outermost) it is one
range per token, and the library moves whole (block, layer) fragments only
(core/transfer plans fragments; there is no sub-fragment range). So the
decode pulls the prefill rank's whole blocks, one-sided as for equal TP, into
host memory registered as the G1 of a second kvbm worker shaped as the
prefill rank's blocks (the library checks that shape: a wrong one fails the
transfer, never lands bytes), then copies its heads out with torch into its
own blocks: strided copies, any order to any order. A pull whose blocks hold
exactly the decode's blocks (equal heads, the same order; MLA) goes straight
into G1 as before.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence

from .. import LayoutConfig, Worker
from ..errors import AlreadyExistsError
from .tp_mapping import kv_heads

__all__ = ["LocalKv", "Staging"]

#: Bytes of staging per pull at a time (a pull of more goes in chunks).
SLOT_BYTES = 8 << 20


def _order(v: Any) -> str:
    """HND (heads outermost in a block) or NHD (tokens outermost) for a
    ``[block, head, token, content]`` view; HND when it makes no difference."""
    _, h, n, _ = (int(s) for s in v.shape)
    if h == 1 or int(v.stride(1)) == n * int(v.stride(2)):
        return "HND"
    if int(v.stride(2)) == h * int(v.stride(1)):
        return "NHD"
    raise ValueError(f"KV view strides {tuple(v.stride())} are neither heads-outer nor "
                     f"tokens-outer within a block")


class LocalKv:
    """A worker's G1 views (one per kvbm layer, ``[block, head, token,
    content]``) and where they sit among the engine's KV heads."""

    def __init__(self, views: Sequence[Any], rank: int, tp_size: int, total_heads: int,
                 mla: bool) -> None:
        self.views = list(views)
        v = self.views[0]
        _, self.heads, self.page, content = (int(s) for s in v.shape)
        self.head_bytes = content * int(v.element_size())
        self.order = _order(v)
        self.rank, self.tp_size, self.total_heads, self.mla = rank, tp_size, total_heads, mla

    def describe(self) -> Dict[str, Any]:
        """What a prefill rank tells a decode about its blocks (in the pull
        reply: NixlConnector's handshake carries the same)."""
        return {"tp_size": self.tp_size, "tp_rank": self.rank, "kv_heads": self.total_heads,
                "mla": self.mla, "heads": self.heads, "page": self.page,
                "head_bytes": self.head_bytes, "layers": len(self.views), "order": self.order}

    def mismatch(self, kv: Dict[str, Any], tp_size: int, rank: int) -> Optional[str]:
        """Why a prefill rank's description kv does not fit this decode's
        blocks (or is not what rank of a prefill of tp_size holds); None
        when it does."""
        want = {"tp_size": tp_size, "tp_rank": rank, "kv_heads": self.total_heads,
                "mla": self.mla, "page": self.page, "head_bytes": self.head_bytes,
                "layers": len(self.views)}
        a, b = kv_heads(rank, tp_size, self.total_heads, self.mla)
        want["heads"] = b - a
        for k, v in want.items():
            if kv.get(k) != v:
                return f"its {k} is {kv.get(k)!r}, this decode expects {v!r}"
        if kv.get("order") not in ("HND", "NHD"):
            return f"its order is {kv.get('order')!r}"
        return None

    def own_mismatch(self) -> Optional[str]:
        """Why this worker's own views do not hold what its rank should."""
        a, b = kv_heads(self.rank, self.tp_size, self.total_heads, self.mla)
        if self.heads != b - a:
            return (f"its KV views hold {self.heads} heads, rank {self.rank} of tensor-parallel "
                    f"size {self.tp_size} of a model with {self.total_heads} KV heads holds "
                    f"{b - a}")
        return None

    def copy_heads(self, stage: "Staging", staged: Sequence[int], src: Any, dst_ids: Sequence[int],
                   dst: Any) -> None:
        """Copies heads src ([start, end)) of the staged blocks into heads dst
        of G1 blocks dst_ids, every layer; returns once the copies are done."""
        import torch
        n = len(staged)
        dev = self.views[0].device
        idx = torch.tensor(list(dst_ids), dtype=torch.long, device=dev)
        at = torch.tensor(list(staged), dtype=torch.long)
        for layer, v in enumerate(self.views):
            s = stage.tensor[at, layer]  # [n, region] (a copy: the staged bytes gathered)
            if stage.order == "HND":
                s = s.view(n, stage.heads, self.page, self.head_bytes)
            else:
                s = s.view(n, self.page, stage.heads, self.head_bytes).transpose(1, 2)
            v.view(torch.uint8)[idx, dst[0]:dst[1]] = s[:, src[0]:src[1]].to(dev)
        if dev.type == "cuda":
            torch.cuda.current_stream(dev).synchronize()


class Staging:
    """Host memory shaped as a prefill rank's blocks (``heads`` in ``order``),
    registered as the G1 of a kvbm worker of its own, in ``slots`` slots of
    ``slot_blocks`` blocks: one slot per pull at a time."""

    def __init__(self, worker_id: int, device_id: int, local: LocalKv, heads: int, order: str,
                 slots: int, min_blocks: int) -> None:
        import torch
        self.heads, self.order = heads, order
        layers = len(local.views)
        region = heads * local.page * local.head_bytes
        self.slot_blocks = max(min_blocks, SLOT_BYTES // (layers * region), 1)
        total = slots * self.slot_blocks
        self.tensor = torch.zeros((total, layers, region), dtype=torch.uint8)
        cfg = LayoutConfig(num_blocks=total, num_layers=layers, outer_dim=1,
                           page_size=local.page, inner_dim=heads * local.head_bytes,
                           dtype_width=1, layout="fully_contiguous")
        for attempt in range(64):
            try:
                w = Worker(worker_id + attempt, device_id=device_id, rank=local.rank)
                break
            except AlreadyExistsError:
                continue
        else:
            raise AlreadyExistsError(f"no free kvbm worker id from {worker_id:x} for staging")
        try:
            w.register_g1_host(cfg, self.tensor)
        except BaseException:
            w.close()
            raise
        self.worker = w
        self._free: List[int] = list(range(slots))
        self._cv = threading.Condition()

    @contextmanager
    def slot(self) -> Iterator[int]:
        """The first block of a free slot, held for the with block."""
        with self._cv:
            while not self._free:
                self._cv.wait()
            s = self._free.pop()
        try:
            yield s * self.slot_blocks
        finally:
            with self._cv:
                self._free.append(s)
                self._cv.notify()

    def close(self) -> None:
        self.worker.close()
