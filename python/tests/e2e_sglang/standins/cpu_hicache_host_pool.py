"""A stand-in for what SGLang's HiCache host pool (MHATokenToKVPoolHost)
lacks on a CPU-only machine: it pins its buffer through CUDA
(cudaHostRegister), and its "direct" io backend copies with sgl_kernel ops,
which the CPU build does not bind. Here the pool is plain host memory
(pinning off), and the three direct copies are torch index copies with the
same semantics as sgl_kernel's (token indices; page_first_direct host
buffers are [page, layer, token in page, head, dim]).

Applied by sitecustomize.py of this directory (SGLang real-engine suite
only) when SGLang imports the module; the installed files are not touched."""
import functools

import torch


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """dst_layers[i][dst_indices] = src_layers[i][src_indices], every i."""
    src = src_indices.to(torch.long)
    dst = dst_indices.to(torch.long)
    for s, d in zip(src_layers, dst_layers, strict=True):
        d[dst] = s[src]


def transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices,
                                       layer_id, page_size):
    """One layer from page_first_direct host buffers (src_ptrs: K, V) into
    layer_first device buffers (dst_ptrs: that layer's K, V)."""
    src = src_indices.to(torch.long)
    dst = dst_indices.to(torch.long)
    for s, d in zip(src_ptrs, dst_ptrs, strict=True):
        d[dst] = s[src // page_size, layer_id, src % page_size]


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices,
                                       page_size):
    """Every layer from layer_first device buffers (src_ptrs: K of each
    layer, then V of each) into page_first_direct host buffers (dst_ptrs: K,
    V)."""
    src = src_indices.to(torch.long)
    dst = dst_indices.to(torch.long)
    layers = len(src_ptrs) // len(dst_ptrs)
    for c, d in enumerate(dst_ptrs):
        for layer in range(layers):
            d[dst // page_size, layer, dst % page_size] = src_ptrs[c * layers + layer][src]


def _unpinned(init):
    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        kwargs["pin_memory"] = False
        init(self, *args, **kwargs)
    return wrapper


def _alloc_unpinned(dims, dtype, device, pin_memory, allocator=None, **kwargs):
    return torch.empty(dims, dtype=dtype, device=device)


def apply_common(module) -> None:
    """sglang.srt.mem_cache.pool_host.common: CPU host buffers are allocated
    without cudaHostRegister."""
    module.ALLOC_MEMORY_FUNCS["cpu"] = _alloc_unpinned


def apply_mha(module) -> None:
    """sglang.srt.mem_cache.pool_host.mha: pinning off, torch copies."""
    cls = module.MHATokenToKVPoolHost
    cls.__init__ = _unpinned(cls.__init__)
    module.transfer_kv_direct = transfer_kv_direct
    module.transfer_kv_per_layer_direct_pf_lf = transfer_kv_per_layer_direct_pf_lf
    module.transfer_kv_all_layer_direct_lf_pf = transfer_kv_all_layer_direct_lf_pf


def apply_mamba(module) -> None:
    """sglang.srt.mem_cache.pool_host.mamba: the Mamba state host pool's
    "direct" copies (page_first_direct host buffers are [slot, layer, 1,
    state...], one slot a page) are the same torch copies."""
    module.transfer_kv_direct = transfer_kv_direct
    module.transfer_kv_per_layer_direct_pf_lf = transfer_kv_per_layer_direct_pf_lf
    module.transfer_kv_all_layer_direct_lf_pf = transfer_kv_all_layer_direct_lf_pf


#: module -> what to do once SGLang has imported it
PATCHES = {
    "sglang.srt.mem_cache.pool_host.common": apply_common,
    "sglang.srt.mem_cache.pool_host.mha": apply_mha,
    "sglang.srt.mem_cache.pool_host.mamba": apply_mamba,
}
