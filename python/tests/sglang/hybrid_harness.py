"""SGLang's own objects for the HiCache storage v2 tests (hybrid models): its
Mamba state host pool and a second MHA host pool (the SWA layers') beside
the KV pool, all on CPU, and the storage methods of its
HybridCacheController run on an instance built without __init__ (the
controller itself needs CUDA streams, events and process groups)."""
import contextlib
import hashlib
import queue
from types import SimpleNamespace

import torch

from hicache_harness import PAGE, host_pool

MAMBA_LAYERS, MAMBA_SLOTS = 2, 8


def mamba_pool(slots=MAMBA_SLOTS, side_state=False):
    """SGLang's MambaPoolHost (page_first_direct, unpinned): a float32
    temporal state and a bf16 conv state per slot (rows of different sizes,
    so kvbm keeps them as two parts), and a side state when asked."""
    from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    extra = (torch.zeros(slots, 6, dtype=torch.int32),) if side_state else ()
    info = MambaStateBufferInfo(
        temporal=torch.zeros(MAMBA_LAYERS, slots, 4, 8, dtype=torch.float32),
        conv=(torch.zeros(MAMBA_LAYERS, slots, 16, 3, dtype=torch.bfloat16),),
        extra_checkpoint_buffers=extra)
    return MambaPoolHost(info, 2.0, 0, device_capacity=slots, pin_memory=False, device="cpu",
                         layout="page_first_direct")


def swa_pool(layout="page_first_direct"):
    """The SWA layers' host pool: an MHA host pool of its own."""
    return host_pool(layout, device_pages=8)


def fill(pool, index, seed):
    """Distinct random bytes in the page at index (a slot for Mamba, the
    first token slot of a page otherwise)."""
    page = pool.get_data_page(index, flat=True)
    n = page.numel() * page.element_size()
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).view(page.dtype)
    pool.set_from_flat_data_page(index, data)


def page_bytes(pool, index):
    page = pool.get_data_page(index, flat=True)
    return page.contiguous().view(torch.uint8).clone()


def digest(pool, index):
    return hashlib.sha256(page_bytes(pool, index).numpy().tobytes()).hexdigest()


class ByteCheck:
    """Records the digest of every page a v2 (or v1) call stored under its
    (pool, key), as SGLang's host pool held it, and checks every page a
    load reported True against it: a page loaded with other bytes than
    those stored under its key is a mismatch."""

    def __init__(self, backend, pools):
        self.pools = pools  # pool name -> host pool
        self.stored = {}
        self.mismatches = []
        self.loaded = 0
        real_set, real_get = backend.batch_set_v2, backend.batch_get_v2

        def batch_set_v2(transfers, extra_info=None):
            res = real_set(transfers, extra_info)
            for t in transfers:
                for i, (k, ok) in enumerate(zip(t.keys or [], res[t.name])):
                    if ok:
                        self.stored[(str(t.name), k)] = self._digest(t, i)
            return res

        def batch_get_v2(transfers, extra_info=None):
            res = real_get(transfers, extra_info)
            for t in transfers:
                for i, (k, ok) in enumerate(zip(t.keys or [], res[t.name])):
                    if ok:
                        self.loaded += 1
                        if self.stored.get((str(t.name), k)) != self._digest(t, i):
                            self.mismatches.append((str(t.name), k))
            return res

        backend.batch_set_v2, backend.batch_get_v2 = batch_set_v2, batch_get_v2

    def _digest(self, t, i):
        pool = self.pools[str(t.name)]
        return digest(pool, int(t.host_indices[i * pool.page_size]))


def hybrid_controller(backend, kv, pools):
    """SGLang's HybridCacheController storage methods, on an instance made
    without __init__: KV moves through v1 (interface_v1), the other pools
    through v2. pools: name -> host pool (KV included)."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import \
        HybridCacheController as H
    c = H.__new__(H)
    c.storage_backend = backend
    c.storage_backend_type = "dynamic"
    c.storage_config = backend.storage_config
    c.storage_host_pool = kv
    c.page_size = kv.page_size
    c.prefetch_sync_queue = queue.Queue()
    c.mem_pool_host = SimpleNamespace(
        layout_lease=contextlib.nullcontext,
        entry_map={name: SimpleNamespace(host_pool=p) for name, p in pools.items()})
    c.page_get_func, c.page_set_func = c._page_get_zero_copy, c._page_set_zero_copy
    c.prefetch_hits_sync_groups = []  # one rank: the MIN over ranks is its own answer
    return c


def keys_of(token_ids):
    from sglang.srt.mem_cache.utils import get_storage_hash_str
    return get_storage_hash_str(token_ids, None, page_size=PAGE)


def backup(ctl, host_indices, token_ids, transfers=()):
    """A node's write to storage as the hybrid controller runs it: the
    pools' v2 set, then the KV pages (v1). Returns the operation."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import StorageOperation
    op = StorageOperation(host_indices, token_ids, hash_value=keys_of(token_ids),
                          pool_transfers=list(transfers) or None)
    ctl._page_backup_or_log(op)
    return op


def hit_query(ctl, token_ids, transfers):
    """SGLang's prefetch hit query as its prefetch thread runs it:
    batch_exists_v2, then the rank sync that picks the longest restorable
    prefix. Returns the operation and the hit in tokens."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import PrefetchOperation
    op = PrefetchOperation(SimpleNamespace(rid="r"), token_ids, pool_transfers=list(transfers))
    hashes, hit_tokens = ctl._storage_hit_query(op)
    hit_tokens = ctl._sync_prefetch_hit_query(op, hit_tokens)
    op.hash_value = hashes[:hit_tokens // ctl.page_size]
    op.storage_hit_count = hit_tokens
    return op, hit_tokens


def transfer(name, keys=None, host_indices=None, policy="trailing_pages", **kw):
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolTransfer
    return PoolTransfer(name=name, keys=keys, host_indices=host_indices,
                        hit_policy=PoolHitPolicy(policy), **kw)
