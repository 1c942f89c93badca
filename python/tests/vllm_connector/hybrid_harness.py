"""The harness's Engine (harness.py) with a hybrid model's KV cache: a
full-attention group and a sliding-window group, built from vLLM's own spec
classes and laid out as vLLM lays out several groups (one tensor per group,
aliasing from byte 0: block b of a group is page b of its layers), with
vLLM's hybrid KV cache manager on. The forward writes each computed block's
pattern into its group's layers; a block of a request that is null in a
group (a sliding window's skipped block) is neither written nor checked."""
import contextlib
import logging

from harness import require_vllm

require_vllm()

import torch  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import ForwardContext  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, KVCacheTensor, SlidingWindowSpec,
                                        compute_layout_strides, create_kv_cache_views)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from harness import BLOCK, HEAD, HEADS, MODEL, Engine, pattern  # noqa: E402

#: Four layers: even ones full attention (group 0), odd ones a sliding
#: window of WINDOW tokens (group 1), as gpt-oss and Gemma alternate them.
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
GROUP_LAYERS = [[0, 2], [1, 3]]
WINDOW = 2 * BLOCK
NULL = 0  # vLLM's null block


def key(block_hash, group):
    """The connector's key of a group's block (kvbmgo.vllm.groups)."""
    return bytes(block_hash) + b"/g%03d" % group


@contextlib.contextmanager
def hybrid_platform():
    """The emulated device's platform says it supports vLLM's hybrid KV
    cache manager (a CUDA or ROCm one does), so VllmConfig decides on HMA
    from the connector alone; yields the records vLLM's config logged."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    h = Keep(logging.DEBUG)
    vllm_log = logging.getLogger("vllm")
    vllm_log.addHandler(h)
    cls = type(current_platform)
    old = cls.__dict__.get("support_hybrid_kv_cache")
    cls.support_hybrid_kv_cache = classmethod(lambda c: True)
    try:
        yield records
    finally:
        vllm_log.removeHandler(h)
        if old is None:
            del cls.support_hybrid_kv_cache
        else:
            cls.support_hybrid_kv_cache = old


class HybridEngine(Engine):
    """Engine over a full-attention + sliding-window model's KV cache."""

    def __init__(self, extra=None, *, layout="LBNHC", num_blocks=64, policy="recompute",
                 max_batched=64, serial=False, pipelined=False, extra_groups=(),
                 window_heads=HEADS, hash_block=BLOCK, role="kv_both", engine_id=None):
        """extra_groups: more KVCacheGroupSpecs after the two (their layers
        get no tensor: the connector must not need them). window_heads: the
        window group's KV heads (its head size keeps its page's bytes).
        hash_block: tokens per request block hash (vLLM's hash_block_size,
        prefix_match_unit: it divides BLOCK). role, engine_id: the
        KVTransferConfig's (P/D)."""
        self.hasher = get_request_block_hasher(hash_block, sha256)
        self.per_block = BLOCK // hash_block
        self.serial = serial
        self.verify = False
        self.pipelined = pipelined
        mc = ModelConfig(model=MODEL, tokenizer=MODEL, skip_tokenizer_init=True,
                         dtype="float16", seed=42)
        sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=max_batched,
                             max_model_len=2048, enable_chunked_prefill=True,
                             is_encoder_decoder=False)
        cc = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, cache_dtype="auto",
                         enable_prefix_caching=True)
        kt = KVTransferConfig(kv_connector="KvbmConnector", kv_connector_module_path="kvbmgo.vllm",
                              kv_role=role, engine_id=engine_id,
                              kv_load_failure_policy=policy,
                              kv_connector_extra_config=dict(extra or {}))
        with hybrid_platform() as self.config_log:
            self.vc = vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc,
                                      kv_transfer_config=kt, device_config=DeviceConfig("cpu"))
        full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                                 dtype=torch.float16)
        window = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=window_heads,
                                   head_size=HEAD * HEADS // window_heads,
                                   dtype=torch.float16, sliding_window=WINDOW)
        self.specs = [full, window]
        lay = KVCacheLayout[layout]
        size = num_blocks * 2 * full.page_size_bytes
        tensors, groups = [], []
        for spec, idx in zip(self.specs, GROUP_LAYERS):
            names = [LAYERS[i] for i in idx]
            ls, bs, *_ = compute_layout_strides(spec, num_blocks, len(names), lay)
            tensors.append(KVCacheTensor(size=size, layers=names, layer_stride=ls,
                                         block_stride=bs, offset=0))
            groups.append(KVCacheGroupSpec(names, spec))
        self.kvc = kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors,
                                       kv_cache_groups=groups + list(extra_groups),
                                       hash_block_size=hash_block)
        vc.cache_config.num_gpu_blocks = num_blocks
        self.raw = torch.zeros(size, dtype=torch.int8)
        self.views = {}
        for spec, t in zip(self.specs, tensors):
            self.views.update(zip(t.layers, create_kv_cache_views(self.raw, spec, num_blocks,
                                                                  lay, t)))
        sched_cls = AsyncScheduler if pipelined else Scheduler
        self.sched = sched_cls(vllm_config=vc, kv_cache_config=kvc, log_stats=True,
                               structured_output_manager=StructuredOutputManager(vc),
                               block_size=BLOCK, hash_block_size=hash_block)
        self.worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kvc)
        self.worker.register_kv_caches(self.views)
        self.ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
        self.events = []
        self.outputs = []
        self.finished = {}
        self.stats = []

    def tables(self, req_id):
        """The request's block table per group (null blocks included)."""
        return [list(t) for t in self.sched.kv_cache_manager.get_block_ids(req_id)[:2]]

    def block_ids(self, req_id):
        return self.tables(req_id)[0]

    def read(self, block_id, layer):
        """A block of a layer as flat int16, in its view's order (the
        groups' views may differ in shape, not in bytes)."""
        return self.views[LAYERS[layer]][block_id].view(torch.int16).reshape(-1).clone()

    def write(self, block_id, layer, data):
        v = self.views[LAYERS[layer]][block_id].view(torch.int16)
        v.copy_(data.reshape(v.shape))

    def bh(self, r, b):
        """The hash of request r's block b (its last hash block's)."""
        return r.block_hashes[(b + 1) * self.per_block - 1]

    def full_blocks(self, r):
        return len(r.block_hashes) // self.per_block

    def holds(self, r, tables, b, group):
        """Block b of request r holds its KV in group's layers (its G1 block
        there is tables[group][b])."""
        return all(torch.equal(self.read(tables[group][b], layer),
                               pattern(self.bh(r, b), layer).reshape(-1))
                   for layer in GROUP_LAYERS[group])

    def check_computed(self, so):
        """Every computed block that a group keeps (not null) holds its KV."""
        for req_id, (start, _) in self.spans(so).items():
            r = self.sched.requests[req_id]
            tables = self.tables(req_id)
            for g in range(2):
                for b in range(start // BLOCK):
                    if tables[g][b] != NULL:
                        assert self.holds(r, tables, b, g), \
                            f"{req_id} block {b} (G1 {tables[g][b]}) of group {g}"

    def forward(self, so):
        """As Engine.forward, per group: a computed block gets its pattern
        in its group's layers unless a block it attends to (a kept one
        before it) is wrong; then junk."""
        for req_id, (start, end) in self.spans(so).items():
            r = self.sched.requests[req_id]
            tables = self.tables(req_id)
            right = all(self.holds(r, tables, b, g) for g in range(2)
                        for b in range(min(start // BLOCK, self.full_blocks(r)))
                        if tables[g][b] != NULL)
            for b in range(start // BLOCK, (end - 1) // BLOCK + 1):
                for g in range(2):
                    assert tables[g][b] != NULL, f"{req_id}: computing block {b} into null"
                    for layer in GROUP_LAYERS[g]:
                        if right and b < self.full_blocks(r) and (b + 1) * BLOCK <= end:
                            self.write(tables[g][b], layer, pattern(self.bh(r, b), layer))
                        else:
                            self.write(tables[g][b], layer,
                                       torch.full((HEADS, BLOCK, 2 * HEAD), -7,
                                                  dtype=torch.int16))
