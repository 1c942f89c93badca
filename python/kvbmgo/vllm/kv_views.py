"""vLLM's per-layer KV views as kvbm sees them: how they register as a
worker's G1 without a copy (g1_layout), and which heads of the model's KV
this rank holds, for P/D between tensor-parallel sizes (local_kv)."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

from .. import LayoutConfig, dense_span

__all__ = ["g1_layout", "local_kv"]

log = logging.getLogger(__name__)


def g1_layout(kv_caches: Dict[str, Any]) -> Tuple[LayoutConfig, List[Any], Dict[str, int]]:
    """How to register vLLM 0.33's per-layer KV views as G1, without a copy.

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
    # Layers that share one KV cache (KV sharing) are registered once.
    first_of: Dict[int, str] = {}
    for name in names:
        first_of.setdefault(int(kv_caches[name].data_ptr()), name)
    views = [kv_caches[n] for n in first_of.values()]
    shape = tuple(int(d) for d in views[0].shape)
    if len(shape) != 4:
        raise ValueError(f"register_kv_caches: a KV view of shape {shape}; expected "
                         f"[num_blocks, num_kv_heads, block_size, 2*head_size]")
    nb, heads, page, content = shape
    width = int(views[0].element_size())
    for n, v in zip(first_of.values(), views):
        if tuple(int(d) for d in v.shape) != shape or int(v.element_size()) != width:
            raise ValueError(f"register_kv_caches: layer {n} has shape {tuple(v.shape)}, "
                             f"the first {shape}: every layer must be alike")
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


def local_kv(kv_caches: Dict[str, Any], index: Dict[str, int], rank: int, tp_size: int,
             kv_heads: int, mla: bool) -> Optional[Any]:
    """The worker's KV as P/D across TP sizes sees it (staging.LocalKv), or
    None when the model's KV heads are unknown or the views' strides are
    not heads- or tokens-outer (then a decode pulls rank to rank only)."""
    if kv_heads <= 0 and not mla:
        return None
    from .staging import LocalKv
    views: Dict[int, Any] = {}
    for name, i in index.items():
        views.setdefault(i, kv_caches[name])
    try:
        return LocalKv([views[i] for i in sorted(views)], rank, tp_size, kv_heads, mla)
    except ValueError as e:
        log.warning("kvbm: P/D between tensor-parallel sizes is off: %s", e)
        return None
