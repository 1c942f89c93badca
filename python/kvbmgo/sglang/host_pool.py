"""SGLang's HiCache host KV pool described as a kvbm layout, without copies.

SGLang's host pool (``mem_cache/pool_host``) is one tensor, ``kv_buffer``,
whose shape depends on the pool's ``layout``:

=================  ===============================  ==========================
layout             MHA ``kv_buffer``                MLA ``kv_buffer``
=================  ===============================  ==========================
layer_first        (2, L, tokens, H, D)             (L, tokens, 1, D)
page_first         (2, tokens, L, H, D)             (tokens, L, 1, D)
page_first_direct  (2, pages, L, page, H, D)        (pages, L, page, 1, D)
=================  ===============================  ==========================

Each maps onto kvbm's ``layer_separate`` layout (one region per "layer",
at any address) so that block i is SGLang's page i:

- page_first, page_first_direct: one region; MHA ``[outer=2][page][...]``
  (block_dim second: K of every page, then V), MLA ``[page][...]``. The
  bytes of a page in one (K or V) half are contiguous in both layouts, so
  they are one fragment of ``page * L * H * D`` elements.
- layer_first: one region per K layer and per V layer (MHA: 2L regions,
  MLA: L), each ``[page][page_size][H * D]``.

A block stored in G2/G3/G4 then holds the bytes of SGLang's flat data page
(``get_data_page(index, flat=True)``) of that layout, so the zero-copy
(``batch_*_v1``) and copying (``get``/``set``) paths store the same bytes.
Other layouts (``page_first_kv_split``, ``page_head``, ...) are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Tuple

from .._layout import LayoutConfig

__all__ = ["HostPoolLayout", "host_pool_layout", "SUPPORTED_LAYOUTS", "PoolPart",
           "PoolLayout", "pool_layout"]

SUPPORTED_LAYOUTS = ("page_first", "page_first_direct", "layer_first")


@dataclass(frozen=True)
class HostPoolLayout:
    """How kvbm sees a host pool: ``config`` (layer_separate, one block per
    SGLang page), its regions (views of ``kv_buffer``, one per kvbm layer,
    for ``Worker.register_g1``), and the size of a page in bytes (kvbm's
    block)."""
    config: LayoutConfig
    regions: Tuple[Any, ...]
    page_bytes: int
    mla: bool
    layout: str

    @property
    def num_pages(self) -> int:
        return self.config.num_blocks

    def staging(self, num_pages: int) -> LayoutConfig:
        """The same block shape as one contiguous region of num_pages pages:
        kvbm's own G2/G3, and the staging area of the copying path."""
        return self.config.replace(num_blocks=num_pages, layout="fully_contiguous",
                                   block_dim="first")


def _is_mla(pool: Any) -> bool:
    return hasattr(pool, "kv_lora_rank")


def host_pool_layout(pool: Any) -> HostPoolLayout:
    """The kvbm layout of SGLang host pool ``pool`` (an MHA or MLA
    ``HostKVCache``, or anything with its ``layout``, ``page_size`` and a
    contiguous ``kv_buffer``). Raises ValueError for a layout kvbm cannot
    describe without copying (naming the supported ones), a page size that
    is not a power of two, a buffer that is not contiguous or whose shape
    does not match its layout; TypeError when there is no ``kv_buffer``."""
    layout = str(getattr(pool, "layout", "layer_first"))
    if layout not in SUPPORTED_LAYOUTS:
        raise ValueError(f"kvbm HiCache storage: host pool layout {layout!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_LAYOUTS)}; start SGLang with "
                         f"--hicache-mem-layout page_first)")
    buf = getattr(pool, "kv_buffer", None)
    if buf is None or not hasattr(buf, "data_ptr"):
        raise TypeError(f"kvbm HiCache storage: the host pool {type(pool).__name__} has no "
                        f"kv_buffer tensor (hybrid and split pools are not supported)")
    if not buf.is_contiguous():
        raise ValueError("kvbm HiCache storage: the host pool's kv_buffer is not contiguous")
    page = int(pool.page_size)
    if page <= 0 or page & (page - 1):
        raise ValueError(f"kvbm HiCache storage: page size {page} is not a power of two")
    shape = tuple(int(d) for d in buf.shape)
    mla = _is_mla(pool)

    def bad(want: str) -> ValueError:
        return ValueError(f"kvbm HiCache storage: {'MLA' if mla else 'MHA'} host pool with "
                          f"layout {layout!r} has kv_buffer shape {shape}, expected {want}")

    # regions: one view of kv_buffer per kvbm "layer" (no copies).
    if mla:
        if layout == "layer_first":
            if len(shape) != 4:
                raise bad("(layers, tokens, 1, dim)")
            pages = shape[1] // page
            n, outer, dim = shape[0], 1, shape[2] * shape[3]
            regions = [buf[l, :pages * page] for l in range(shape[0])]
        elif layout == "page_first":
            if len(shape) != 4:
                raise bad("(tokens, layers, 1, dim)")
            pages = shape[0] // page
            n, outer, dim = 1, 1, math.prod(shape[1:])
            regions = [buf[:pages * page]]
        else:
            if len(shape) != 5 or shape[2] != page:
                raise bad(f"(pages, layers, {page}, 1, dim)")
            pages = shape[0]
            n, outer, dim = 1, 1, math.prod(shape[1:]) // page
            regions = [buf]
    else:
        if not shape or shape[0] != 2:
            raise bad("a leading dimension of 2 (K, V)")
        if layout == "layer_first":
            if len(shape) != 5:
                raise bad("(2, layers, tokens, heads, head_dim)")
            pages = shape[2] // page
            n, outer, dim = 2 * shape[1], 1, shape[3] * shape[4]
            regions = [buf[kv, l, :pages * page] for kv in range(2) for l in range(shape[1])]
        elif layout == "page_first":
            if len(shape) != 5:
                raise bad("(2, tokens, layers, heads, head_dim)")
            if shape[1] % page:
                # K's pages and V's pages are one region only when no
                # partial page lies between them.
                raise bad(f"a token count that is a multiple of the page size {page}")
            pages = shape[1] // page
            n, outer, dim = 1, 2, math.prod(shape[2:])
            regions = [buf]
        else:
            if len(shape) != 6 or shape[3] != page:
                raise bad(f"(2, pages, layers, {page}, heads, head_dim)")
            pages = shape[1]
            n, outer, dim = 1, 2, math.prod(shape[2:]) // page
            regions = [buf]
    if pages <= 0:
        raise ValueError(f"kvbm HiCache storage: the host pool holds no whole page of {page} "
                         f"tokens (kv_buffer shape {shape})")
    cfg = LayoutConfig(num_blocks=pages, num_layers=n, outer_dim=outer, page_size=page,
                       inner_dim=dim, dtype_width=int(buf.element_size()),
                       layout="layer_separate", block_dim="second" if outer == 2 else "first")
    return HostPoolLayout(cfg, tuple(regions), cfg.block_bytes, mla, layout)


# ---- the host pools of hybrid models (HiCache storage v2)


@dataclass(frozen=True)
class PoolPart:
    """Buffers of a host pool whose pages have one size: one kvbm layout
    (layer_separate, one region per buffer, block i = the pool's page i)."""
    config: LayoutConfig
    regions: Tuple[Any, ...]


@dataclass(frozen=True)
class PoolLayout:
    """How kvbm sees any host pool SGLang registers through
    ``register_mem_host_pool_v2``: one part per page size among its buffers
    (an MHA/MLA pool has one; a Mamba pool one per distinct state row), each
    its own kvbm layout. A page of the pool is stored when every part
    stored it. ``signature`` names the shape (in the pool's keys, so a
    changed shape is never loaded)."""
    parts: Tuple[PoolPart, ...]
    page_size: int
    num_pages: int
    signature: str

    @property
    def page_bytes(self) -> int:
        return sum(p.config.block_bytes for p in self.parts)


#: Slot-major layouts of SGLang's state pools: a slot's rows are contiguous
#: in each buffer.
_STATE_LAYOUTS = ("page_first", "page_first_direct")


def pool_layout(pool: Any) -> PoolLayout:
    """The kvbm layout of any SGLang host pool (_pool_layout), checked
    against the pool's own page size: a pool that keeps bytes of a page
    outside the buffers kvbm sees (scales, say) is refused, not stored in
    part."""
    pl = _pool_layout(pool)
    size = getattr(pool, "get_size_per_token", None)
    if callable(size):
        want = int(size()) * pl.page_size
        if want != pl.page_bytes:
            raise ValueError(f"kvbm HiCache storage: host pool {type(pool).__name__} has "
                             f"{want} bytes a page, its buffers kvbm can see "
                             f"{pl.page_bytes}")
    return pl


def _pool_layout(pool: Any) -> PoolLayout:
    """The kvbm layout of any SGLang host pool: an MHA/MLA pool (one
    ``kv_buffer`` tensor, as ``host_pool_layout``: SWA, draft and the KV
    pool itself), or a state pool whose ``kv_buffer`` is a list of buffers
    with the slot first (``MambaPoolHost``: temporal state, conv states,
    side states; each slot one page). Buffers are seen as bytes, without
    copies. Raises ValueError/TypeError naming what kvbm cannot describe."""
    buf = getattr(pool, "kv_buffer", None)
    if buf is not None and hasattr(buf, "data_ptr"):
        hl = host_pool_layout(pool)
        sig = (f"{hl.layout}|mla={int(hl.mla)}|page={hl.config.page_size}|"
               f"bytes={hl.page_bytes}|width={hl.config.dtype_width}")
        return PoolLayout((PoolPart(hl.config, hl.regions),), hl.config.page_size,
                          hl.num_pages, sig)
    if not isinstance(buf, (list, tuple)) or not buf:
        raise TypeError(f"kvbm HiCache storage: host pool {type(pool).__name__} has no "
                        f"kv_buffer (a tensor or a list of state buffers)")
    import torch
    layout = str(getattr(pool, "layout", ""))
    if layout not in _STATE_LAYOUTS:
        raise ValueError(f"kvbm HiCache storage: state pool {type(pool).__name__} has layout "
                         f"{layout!r}; kvbm keeps slot-major ones ({', '.join(_STATE_LAYOUTS)})")
    page = int(getattr(pool, "page_size", 1) or 1)
    slots = {int(b.shape[0]) for b in buf}
    if len(slots) != 1:
        raise ValueError(f"kvbm HiCache storage: state pool {type(pool).__name__}'s buffers "
                         f"hold {sorted(slots)} slots, not one count")
    pages = slots.pop() // page
    if pages <= 0:
        raise ValueError(f"kvbm HiCache storage: state pool {type(pool).__name__} holds no "
                         f"whole page of {page} slots")
    by_row: dict = {}  # page bytes -> regions, in buffer order
    for i, b in enumerate(buf):
        if not b.is_contiguous():
            raise ValueError(f"kvbm HiCache storage: state pool {type(pool).__name__}'s "
                             f"buffer {i} is not contiguous")
        row = page * math.prod(int(d) for d in b.shape[1:]) * b.element_size()
        if row == 0:
            continue
        region = b[:pages * page].reshape(-1).view(torch.uint8).reshape(pages, row)
        by_row.setdefault(row, []).append(region)
    if not by_row:
        raise ValueError(f"kvbm HiCache storage: state pool {type(pool).__name__} has no bytes")
    parts = tuple(
        PoolPart(LayoutConfig(num_blocks=pages, num_layers=len(regions), outer_dim=1,
                              page_size=1, inner_dim=row, dtype_width=1,
                              layout="layer_separate", block_dim="first"), tuple(regions))
        for row, regions in by_row.items())
    sig = f"state|{layout}|page={page}|rows=" + ",".join(
        f"{p.config.num_layers}x{p.config.inner_dim}" for p in parts)
    return PoolLayout(parts, page, pages, sig)
