"""SGLang's own objects for the HiCache backend tests: its host KV pool (built
on CPU), its storage config and backend factory, and the storage methods of
its HiCacheController run over a stand-in ``self`` (the controller itself
needs CUDA streams and events)."""
import os
import queue

import pytest


def require_sglang():
    """Imports sglang; skips the module (fails it under KVBM_REQUIRE_ENGINES=1)
    when it cannot."""
    try:
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage  # noqa: F401
        from sglang.srt.managers.cache_controller import HiCacheController  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means no engine
        reason = (f"sglang 0.5.23 is not importable ({type(e).__name__}: {e}); "
                  f"`make test-sglang` runs these tests in its venv")
        if os.environ.get("KVBM_REQUIRE_ENGINES") == "1":
            pytest.fail(reason + " (KVBM_REQUIRE_ENGINES=1)", pytrace=False)
        pytest.skip(reason, allow_module_level=True)


LAYERS, HEADS, HEAD_DIM, PAGE = 3, 2, 8, 4


def host_pool(layout="page_first", device_pages=16, ratio=2.0, dtype=None, mla=False):
    """SGLang's own MHA (or MLA) host pool over a CPU "device" pool, unpinned."""
    import torch
    if mla:
        return _mla_host_pool(layout, device_pages, ratio, dtype or torch.bfloat16)
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    dtype = dtype or torch.bfloat16
    tokens = device_pages * PAGE
    k = [torch.zeros(tokens, HEADS, HEAD_DIM, dtype=dtype) for _ in range(LAYERS)]
    v = [torch.zeros(tokens, HEADS, HEAD_DIM, dtype=dtype) for _ in range(LAYERS)]
    info = MHABufferInfo(
        buffers=KVBuffers(k=tuple(k), v=tuple(v),
                          k_data_ptrs=torch.tensor([t.data_ptr() for t in k]),
                          v_data_ptrs=torch.tensor([t.data_ptr() for t in v]),
                          layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=HEADS, head_dim=HEAD_DIM, v_head_dim=HEAD_DIM, dtype=dtype,
        device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, host_to_device_ratio=ratio, host_size=0, page_size=PAGE,
                                layout=layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=LAYERS)


def _mla_host_pool(layout, device_pages, ratio, dtype):
    import torch
    from sglang.srt.mem_cache.device_pool_info import MLABufferInfo
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    tokens, lora, rope = device_pages * PAGE, 12, 4
    bufs = tuple(torch.zeros(tokens, 1, lora + rope, dtype=dtype) for _ in range(LAYERS))
    info = MLABufferInfo(buffers=bufs, data_ptrs=torch.tensor([b.data_ptr() for b in bufs]),
                         layer_indices=tuple(range(LAYERS)), device_layer_num=LAYERS,
                         page_size=PAGE, kv_lora_rank=lora, qk_rope_head_dim=rope,
                         kv_cache_dim=lora + rope, dtype=dtype, device=torch.device("cpu"))
    return MLATokenToKVPoolHost(info, ratio, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=LAYERS,
                                target_layer_num=LAYERS)


def storage_config(extra, tp_rank=0, tp_size=1, model="tiny", page_first=True, mla=False,
                   dp_rank=0):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=page_first, model_name=model, dp_rank=dp_rank,
        extra_config=dict(extra))


def kvbm_extra(v1=True, **ours):
    return {"backend_name": "kvbm", "module_path": "kvbmgo.sglang",
            "class_name": "KvbmHiCacheStorage", "interface_v1": int(v1), **ours}


def create_backend(host, extra, **cfg):
    """As HiCacheController.attach_storage_backend: SGLang's factory builds
    the backend ("dynamic"), then the host pool is registered."""
    from sglang.srt.mem_cache.storage import StorageBackendFactory
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(extra, **cfg), host)
    backend.register_mem_pool_host(host)
    backend.on_host_pools_registered()
    return backend


def fill_pages(host, host_indices, seed):
    """Distinct bytes in every page at host_indices (token slots)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    for i in range(0, len(host_indices), host.page_size):
        page = host.get_data_page(host_indices[i], flat=True)
        data = torch.randint(-30000, 30000, (page.numel(),), generator=g,
                             dtype=torch.int16).view(page.dtype)
        host.set_from_flat_data_page(host_indices[i], data)


def pages_of(host, host_indices):
    """The flat bytes of every page at host_indices (copies)."""
    return [host.get_data_page(host_indices[i], flat=True).clone()
            for i in range(0, len(host_indices), host.page_size)]


class Recorder:
    """Records the backend calls (name, number of keys, host_indices given)."""

    NAMES = ("batch_exists", "exists", "batch_set_v1", "batch_get_v1", "batch_set",
             "batch_get", "set", "get")

    def __init__(self, backend):
        self.calls = []
        for name in self.NAMES:
            real = getattr(backend, name)

            def wrap(*a, _real=real, _name=name, **kw):
                self.calls.append((_name, len(a[0]) if isinstance(a[0], list) else 1,
                                   len(a) > 1 and _name.endswith("_v1")))
                return _real(*a, **kw)
            setattr(backend, name, wrap)

    def names(self):
        out = []
        for n, _, _ in self.calls:
            if not out or out[-1] != n:
                out.append(n)
        return out


def controller(backend, host):
    """SGLang's HiCacheController storage methods over a stand-in self, with
    the page functions chosen as attach_storage_backend chooses them."""
    from sglang.srt.managers.cache_controller import HiCacheController as C

    class Controller:
        _page_backup = C._page_backup
        _storage_hit_query = C._storage_hit_query
        _page_transfer = C._page_transfer
        _page_transfer_kv_batch = C._page_transfer_kv_batch
        _page_get_zero_copy = C._page_get_zero_copy
        _page_set_zero_copy = C._page_set_zero_copy
        _generic_page_get = C._generic_page_get
        _generic_page_set = C._generic_page_set

    c = Controller()
    c.storage_backend = backend
    c.storage_host_pool = c.mem_pool_host = host
    c.page_size = host.page_size
    c.prefetch_sync_queue = queue.Queue()
    extra = backend.storage_config.extra_config
    if bool(extra.get("interface_v1", 0)):  # attach_storage_backend's rule for "dynamic"
        c.page_get_func, c.page_set_func = c._page_get_zero_copy, c._page_set_zero_copy
    else:
        c.page_get_func, c.page_set_func = c._generic_page_get, c._generic_page_set
    return c


def backup(ctl, host_indices, token_ids):
    """SGLang's write-through to storage: keys from the tokens, _page_backup.
    Returns (keys, tokens written)."""
    from sglang.srt.managers.cache_controller import StorageOperation
    from sglang.srt.mem_cache.utils import get_storage_hash_str
    keys = get_storage_hash_str(token_ids, None, page_size=ctl.page_size)
    op = StorageOperation(host_indices, token_ids, hash_value=keys)
    ctl._page_backup(op)
    return keys, op.completed_tokens


def prefetch(ctl, host, token_ids, rid="r"):
    """SGLang's prefetch: _storage_hit_query (batch_exists), host pages for
    the hit, _page_transfer (batch_get[_v1]). Returns (host_indices, pages
    loaded)."""
    from sglang.srt.managers.cache_controller import PrefetchOperation
    op = PrefetchOperation(rid, token_ids)
    hashes, hit_tokens = ctl._storage_hit_query(op)
    if not hashes:
        return None, 0
    op.hash_value = hashes
    op.host_indices = host.alloc(hit_tokens)
    return op.host_indices, ctl._page_transfer(op)
