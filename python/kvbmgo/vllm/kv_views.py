"""vLLM's per-layer KV views as kvbm sees them: how they register as a
worker's G1 without a copy (g1_layout), and which heads of the model's KV
this rank holds and in which order, for P/D between tensor-parallel sizes
(LocalKv, local_kv): a decode pulls the heads it takes from a prefill rank
with a head slice (kvbmgo.HeadSlice), which the library plans as byte
ranges of each (block, layer), heads- or tokens-outer on either side."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import HeadSlice, LayoutConfig, dense_span
from .tp_mapping import Read, kv_heads

__all__ = ["g1_layout", "local_kv", "LocalKv", "check_block_count"]

log = logging.getLogger(__name__)


def g1_layout(kv_caches: Dict[str, Any]) -> Tuple[LayoutConfig, List[Any], Dict[str, int]]:
    """How to register vLLM's (0.32 to 0.34) per-layer KV views as G1, without a copy.

    Each view is ``[num_blocks, num_kv_heads, block_size, 2*head_size]`` with
    the strides of the KV cache layout. kvbm needs, per (block, layer), one
    dense region: true when the block is the outermost dimension of the
    layer's storage (LBNHC, LBHNC: one region per layer, registered
    layer_separate) or of the whole cache with layers next inside it (BLNHC,
    BLHNC: one region, registered fully_contiguous). The bytes inside a
    region keep vLLM's order; G2/G3 copy them as they are. Returns the
    config, the buffers to register and each layer name's kvbm layer index.
    Raises ValueError for another layout (BHLNC, LHBNC)."""
    names = list(kv_caches)
    if not names:
        raise ValueError("register_kv_caches: no KV caches")
    # Layers that share one KV cache (KV sharing, or other KV cache groups'
    # layers over the same pages) are registered once, as the layer whose
    # block spans the most bytes there (an attention page beside a Mamba
    # state that pads to it).
    first_of: Dict[int, str] = {}
    for name in names:
        ptr = int(kv_caches[name].data_ptr())
        first = first_of.setdefault(ptr, name)
        if _block_bytes(kv_caches[name]) > _block_bytes(kv_caches[first]):
            first_of[ptr] = name
    views = [kv_caches[n] for n in first_of.values()]
    for name in names:
        first = first_of[int(kv_caches[name].data_ptr())]
        if name != first:
            _check_alias(name, kv_caches[name], first, kv_caches[first])
    shapes = {(tuple(int(d) for d in v.shape), int(v.element_size())) for v in views}
    if len(shapes) > 1:
        return _page_layout(kv_caches, first_of)
    shape = tuple(int(d) for d in views[0].shape)
    if len(shape) != 4:
        raise ValueError(f"register_kv_caches: a KV view of shape {shape}; expected "
                         f"[num_blocks, num_kv_heads, block_size, 2*head_size]")
    nb, heads, page, content = shape
    width = int(views[0].element_size())
    region = heads * page * content * width  # one block of one layer
    for n, v in zip(first_of.values(), views):
        try:
            if dense_span(v[0]).nbytes != region:
                raise ValueError("")
        except ValueError:
            raise ValueError(f"register_kv_caches: layer {n} (strides {tuple(v.stride())}) "
                             f"does not keep a block of a layer in one dense region; layouts "
                             f"LBNHC, LBHNC, BLNHC and BLHNC are supported") from None
    block_stride = int(views[0].stride(0)) * width
    num_layers = len(views)
    cfg = LayoutConfig(num_blocks=nb, num_layers=num_layers, outer_dim=1, page_size=page,
                       inner_dim=heads * content, dtype_width=width)
    if block_stride == region:
        # A region per layer: layer i is kvbm layer i.
        buffers = [dense_span(v, f"KV cache of {n}") for n, v in zip(first_of.values(), views)]
        index = {n: i for i, n in enumerate(first_of.values())}
        cfg = cfg.replace(layout="layer_separate", block_dim="first")
    elif block_stride == region * num_layers:
        # Cross-layer: [block][layer][region]; kvbm's layer i is the one at offset i*region.
        base = min(int(v.data_ptr()) for v in views)
        offsets = {n: (int(v.data_ptr()) - base) for n, v in zip(first_of.values(), views)}
        if sorted(offsets.values()) != [i * region for i in range(num_layers)]:
            raise ValueError("register_kv_caches: cross-layer KV views that are not "
                             "[block][layer] in one tensor")
        index = {n: off // region for n, off in offsets.items()}
        from .._memory import Buffer
        dev = views[0].device
        device = (dev.index or 0) if dev.type == "cuda" else None
        buffers = [Buffer(base, nb * num_layers * region, width, device, list(views))]
        cfg = cfg.replace(layout="fully_contiguous")
    else:
        raise ValueError(f"register_kv_caches: block stride {block_stride} bytes is neither a "
                         f"layer's block ({region}) nor all layers' ({region * num_layers})")
    for name in names:  # the layers sharing another's cache
        index.setdefault(name, index[first_of[int(kv_caches[name].data_ptr())]])
    return cfg, buffers, index


def check_block_count(kv_caches: Dict[str, Any], blocks: int) -> None:
    """Refuses, at start, views that do not count vLLM's blocks (blocks;
    0: not known): with an attention kernel's block smaller than vLLM's,
    dim 0 counts kernel blocks, which kvbm would take for vLLM's blocks."""
    split = sorted(n for n, t in kv_caches.items() if blocks and int(t.shape[0]) != blocks)
    if split:
        raise ValueError(f"register_kv_caches: the KV views of {', '.join(split[:3])} hold "
                         f"{int(kv_caches[split[0]].shape[0])} blocks, vLLM's KV cache has "
                         f"{blocks}: views of kernel blocks (an attention kernel's block "
                         f"smaller than vLLM's block) are not supported yet")


def _block_bytes(v: Any) -> int:
    """The bytes one block of view v spans (0: not one dense region)."""
    try:
        return dense_span(v[0]).nbytes
    except ValueError:
        return 0


def _check_alias(name: str, v: Any, first: str, f: Any) -> None:
    """A layer registered as another (it shares its memory: KV sharing, or
    another KV cache group's layer over the same pages, vLLM's hybrid
    layout) must keep a block where that one does and within its bytes
    (a Mamba state's padded page is the attention page it aliases): then
    the other's registration covers it, whatever its view's shape."""
    stride = int(v.stride(0)) * int(v.element_size())
    f_stride = int(f.stride(0)) * int(f.element_size())
    own = _block_bytes(v)
    same = stride == f_stride and int(v.shape[0]) == int(f.shape[0]) and \
        0 < own <= _block_bytes(f)
    if not same:
        raise ValueError(f"register_kv_caches: layer {name} (shape {tuple(v.shape)}, strides "
                         f"{tuple(v.stride())}) shares the memory of layer {first} (shape "
                         f"{tuple(f.shape)}, strides {tuple(f.stride())}) but not its blocks: "
                         f"kvbm registers it as that layer")


def _page_layout(kv_caches: Dict[str, Any], first_of: Dict[int, str]
                 ) -> Tuple[LayoutConfig, List[Any], Dict[str, int]]:
    """G1 of layers whose views differ in shape (a Mamba group's state
    pages beside attention pages, vLLM's hybrid layouts), as pages of bytes
    moved as they are. Layer-outer (each layer's blocks one after another,
    a block its padded page): a kvbm layer per distinct layer memory, a
    block its block stride. Block-outer (every layer's page of a block
    packed together, the block stride spanning them all): one kvbm layer
    over the whole allocation, a block the packed block."""
    views = [kv_caches[n] for n in first_of.values()]
    strides = {int(v.stride(0)) * int(v.element_size()) for v in views}
    blocks = {int(v.shape[0]) for v in views}
    described = "; ".join(f"{n}: shape {tuple(kv_caches[n].shape)}, {kv_caches[n].dtype}, "
                          f"block stride {int(kv_caches[n].stride(0)) * kv_caches[n].element_size()}"
                          for n in first_of.values())
    if len(strides) != 1 or len(blocks) != 1:
        raise ValueError(f"register_kv_caches: KV views of different block strides or block "
                         f"counts ({described}); kvbm registers layers of one page size")
    stride, nb = strides.pop(), blocks.pop()
    spans = [_block_bytes(v) for v in views]
    if any(b <= 0 or b > stride for b in spans):
        raise ValueError(f"register_kv_caches: a block of a KV view is not one dense region "
                         f"within its block stride ({described})")
    from .._memory import Buffer
    dev = views[0].device
    device = (dev.index or 0) if dev.type == "cuda" else None
    ptrs = sorted(int(v.data_ptr()) for v in views)
    if all(b < stride for b in spans) and ptrs[-1] - ptrs[0] < stride:
        # Block-outer: the views start inside the first block, at their
        # layer's offset; block b of every layer is [b*stride, (b+1)*stride).
        buffers = [Buffer(ptrs[0], nb * stride, 1, device, views)]
        index = {name: 0 for name in kv_caches}
        num_layers = 1
    else:
        for a, b in zip(ptrs, ptrs[1:]):
            if a + nb * stride > b:
                raise ValueError(f"register_kv_caches: the KV views' memory overlaps across "
                                 f"layers as neither a layer-outer nor a block-outer layout "
                                 f"keeps it ({described})")
        buffers = [Buffer(int(v.data_ptr()), nb * stride, 1, device, v) for v in views]
        index = {n: i for i, n in enumerate(first_of.values())}
        for name in kv_caches:
            index.setdefault(name, index[first_of[int(kv_caches[name].data_ptr())]])
        num_layers = len(views)
    cfg = LayoutConfig(num_blocks=nb, num_layers=num_layers, outer_dim=1, page_size=1,
                       inner_dim=stride, dtype_width=1, layout="layer_separate",
                       block_dim="first")
    return cfg, buffers, index


def local_kv(kv_caches: Dict[str, Any], index: Dict[str, int], rank: int, tp_size: int,
             total_heads: int, mla: bool) -> Optional["LocalKv"]:
    """The worker's KV as P/D across TP sizes sees it (LocalKv), or
    None when the model's KV heads are unknown or the views' strides are
    not heads- or tokens-outer (then a decode pulls rank to rank only)."""
    if total_heads <= 0 and not mla:
        return None
    views: Dict[int, Any] = {}
    for name, i in index.items():
        views.setdefault(i, kv_caches[name])
    # A hybrid model's groups over the same pages (groups.py) are sliced
    # by the first one's heads: only when every group's views hold as many.
    heads = {int(kv_caches[name].shape[1]) for name in index if name in kv_caches}
    if len(heads) > 1:
        log.warning("kvbm: P/D between tensor-parallel sizes is off: the KV cache groups' "
                    "views hold %s heads per block (a decode pulls from a prefill of its "
                    "own TP size only)", sorted(heads))
        return None
    try:
        return LocalKv([views[i] for i in sorted(views)], rank, tp_size, total_heads, mla)
    except ValueError as e:
        log.warning("kvbm: P/D between tensor-parallel sizes is off: %s", e)
        return None


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

    def head_slice(self, read: Read, kv: Dict[str, Any]) -> HeadSlice:
        """The head slice of read: heads read.src of the prefill rank's
        blocks (described by kv, checked by mismatch) into heads read.dst
        of this worker's."""
        return HeadSlice(count=read.src[1] - read.src[0], src_heads=int(kv["heads"]),
                         src_first=read.src[0], src_order=str(kv["order"]),
                         dst_heads=self.heads, dst_first=read.dst[0], dst_order=self.order)
