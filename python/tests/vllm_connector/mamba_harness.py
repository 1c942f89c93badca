"""The harness's Engine (harness.py) over a Mamba / linear-attention hybrid's
KV cache, with vLLM's hybrid KV cache manager on and its Mamba "align" cache
mode (prefix caching of Mamba states at block boundaries): a full-attention
group, a Mamba group and optionally a sliding-window group, built from
vLLM's own spec classes and laid out as vLLM lays out several groups (one
allocation; every group's tensors alias from byte 0; Mamba pages padded to
the attention page).

The forward is a Mamba's as vLLM's align mode runs it: a step that computes
tokens [start, end) of a request reads its state after start tokens from
the request's state block for start (its table entry cdiv(start, BLOCK) - 1)
and writes its state after end tokens into the entry for end. A state
after a whole number of blocks is a pattern of the prefix's block hash (so
a stored and loaded state can be checked byte for byte); after a partial
block, a pattern of the tokens (so a prefill's state after N-1 prompt
tokens is the one a decode of the same prompt expects). A step that reads a
wrong state (or a wrong attention block) writes junk, as a model would
compute junk from it."""
import hashlib

import numpy as np

from harness import require_vllm

require_vllm()

import torch  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import ForwardContext  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, KVCacheTensor, MambaSpec,
                                        SlidingWindowSpec, compute_layout_strides,
                                        create_kv_cache_views)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from harness import BLOCK, HEAD, HEADS, MODEL, Engine, pattern  # noqa: E402
from hybrid_harness import hybrid_platform  # noqa: E402

#: The Mamba's state per layer: a conv state and an SSM state (bytes).
STATE_SHAPES = ((4, 8), (2, 16))
STATE_DTYPES = (torch.float16, torch.float32)
WINDOW = 2 * BLOCK
NULL = 0


def state(seed: bytes, layer: int, nbytes: int) -> torch.Tensor:
    """A layer's Mamba state derived from seed (int8)."""
    rng = np.random.default_rng(int.from_bytes(bytes(seed)[:8], "little") + 104729 * layer)
    return torch.from_numpy(rng.integers(-128, 127, size=(nbytes,), dtype=np.int8))


class MambaEngine(Engine):
    """Engine over a full-attention + Mamba (+ sliding-window) model's KV
    cache. Groups, in vLLM's order: 0 full attention (layers 1, 3), 1 Mamba
    (layers 0, 2: a Mamba layer comes first, as in Nemotron-H and
    Qwen3-Next), and with window=True 2 sliding window (layers 4, 5)."""

    def __init__(self, extra=None, *, layout="LBNHC", num_blocks=96, policy="recompute",
                 max_batched=64, window=False, serial=False, mode="align",
                 attention_layers=2, role="kv_both", engine_id=None):
        """attention_layers: 1 leaves the second Mamba layer's pages aliased
        by no attention layer (G1 registered as pages of bytes). role,
        engine_id: the KVTransferConfig's (P/D)."""
        self.serial = serial
        self.verify = False
        self.pipelined = False
        mc = ModelConfig(model=MODEL, tokenizer=MODEL, skip_tokenizer_init=True,
                         dtype="float16", seed=42)
        sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=max_batched,
                             max_model_len=2048, enable_chunked_prefill=True,
                             is_encoder_decoder=False)
        cc = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, cache_dtype="auto",
                         enable_prefix_caching=True, mamba_cache_mode=mode)
        kt = KVTransferConfig(kv_connector="KvbmConnector", kv_connector_module_path="kvbmgo.vllm",
                              kv_role=role, engine_id=engine_id,
                              kv_load_failure_policy=policy,
                              kv_connector_extra_config=dict(extra or {}))
        with hybrid_platform() as self.config_log:
            self.vc = vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc,
                                      kv_transfer_config=kt, device_config=DeviceConfig("cpu"))
        full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                                 dtype=torch.float16)
        mamba = MambaSpec(block_size=BLOCK, shapes=STATE_SHAPES, dtypes=STATE_DTYPES,
                          page_size_padded=full.page_size_bytes, mamba_cache_mode=mode)
        self.state_bytes = mamba.state_content_size_bytes
        self.kinds = ["full", "mamba"]
        specs = [full, mamba]
        self.group_layers = [[1, 3][:attention_layers], [0, 2]]
        if window:
            specs.append(SlidingWindowSpec(block_size=BLOCK, num_kv_heads=HEADS,
                                           head_size=HEAD, dtype=torch.float16,
                                           sliding_window=WINDOW))
            self.kinds.append("window")
            self.group_layers.append([4, 5])
        self.specs = specs
        self.layers = [f"model.layers.{i}.{'mixer' if i in (0, 2) else 'self_attn.attn'}"
                       for i in range(2 * len(specs))]
        lay = KVCacheLayout[layout]
        size = num_blocks * 2 * full.page_size_bytes
        tensors, groups = [], []
        for spec, idx in zip(specs, self.group_layers):
            names = [self.layers[i] for i in idx]
            # As vLLM's planner: block-outer layouts pack every layer's page
            # of a block (2 pages); layer-outer ones pad a Mamba page.
            stride = 2 * full.page_size_bytes if lay.is_block_outermost else \
                getattr(spec, "page_size_padded", None)
            ls, bs, *_ = compute_layout_strides(spec, num_blocks, len(names), lay,
                                                fixed_strides=(None, stride, None, None, None))
            tensors.append(KVCacheTensor(size=size, layers=names, layer_stride=ls,
                                         block_stride=bs, offset=0))
            groups.append(KVCacheGroupSpec(names, spec))
        self.kvc = kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors,
                                       kv_cache_groups=groups)
        vc.cache_config.num_gpu_blocks = num_blocks
        self.raw = torch.zeros(size, dtype=torch.int8)
        self.views = {}
        for spec, t in zip(specs, tensors):
            self.views.update(zip(t.layers, create_kv_cache_views(self.raw, spec, num_blocks,
                                                                  lay, t)))
        self.sched = Scheduler(vllm_config=vc, kv_cache_config=kvc, log_stats=True,
                               structured_output_manager=StructuredOutputManager(vc),
                               block_size=BLOCK)
        self.worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kvc)
        self.worker.register_kv_caches(self.views)
        self.ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
        self.events = []
        self.outputs = []
        self.finished = {}
        self.stats = []
        #: Every state the forward wrote: (req_id, tokens) -> G1 block.
        self.states = {}

    # ---- G1 as each group sees it

    def tables(self, req_id):
        return [list(t) for t in self.sched.kv_cache_manager.get_block_ids(req_id)]

    def block_ids(self, req_id):
        return self.tables(req_id)[0]

    def bh(self, r, b):
        return r.block_hashes[b]

    def read_kv(self, block_id, layer):
        return self.views[self.layers[layer]][block_id].view(torch.int16).reshape(-1).clone()

    def write_kv(self, block_id, layer, data):
        v = self.views[self.layers[layer]][block_id].view(torch.int16)
        v.copy_(data.reshape(v.shape))

    def read_state(self, block_id, layer):
        return self.views[self.layers[layer]][block_id].reshape(-1).clone()

    def write_state(self, block_id, layer, data):
        self.views[self.layers[layer]][block_id].reshape(-1).copy_(data)

    def expected_state(self, r, tokens, layer):
        """The state of request r after tokens (its prefix's when whole
        blocks: the same for any request with that prefix)."""
        if tokens % BLOCK == 0:
            seed = bytes(self.bh(r, tokens // BLOCK - 1))
        else:
            ids = np.asarray(list(r.all_token_ids[:tokens]), dtype=np.int64)
            seed = hashlib.sha256(ids.tobytes() + b"#%d" % tokens).digest()
        return state(seed, layer, self.state_bytes)

    def state_block(self, table, tokens):
        """The G1 block vLLM's align mode keeps the state after tokens in."""
        return table[-(-tokens // BLOCK) - 1]

    def holds_state(self, r, table, tokens, g):
        b = self.state_block(table, tokens)
        return b != NULL and all(torch.equal(self.read_state(b, layer),
                                             self.expected_state(r, tokens, layer))
                                 for layer in self.group_layers[g])

    def holds_kv(self, r, table, b, g):
        return all(torch.equal(self.read_kv(table[b], layer),
                               pattern(self.bh(r, b), layer).reshape(-1))
                   for layer in self.group_layers[g])

    def right_before(self, r, tables, start):
        """Every kept attention block before start holds its KV, and each
        Mamba group's state after start tokens is where vLLM reads it."""
        for g, kind in enumerate(self.kinds):
            if kind == "mamba":
                if start and not self.holds_state(r, tables[g], start, g):
                    return False
                continue
            for b in range(min(start // BLOCK, len(r.block_hashes))):
                if tables[g][b] != NULL and not self.holds_kv(r, tables[g], b, g):
                    return False
        return True

    def check_computed(self, so):
        for req_id, (start, _) in self.spans(so).items():
            r = self.sched.requests[req_id]
            assert self.right_before(r, self.tables(req_id), start), \
                f"{req_id}: G1 wrong before computing from token {start}"

    def forward(self, so):
        for req_id, (start, end) in self.spans(so).items():
            r = self.sched.requests[req_id]
            tables = self.tables(req_id)
            right = self.right_before(r, tables, start)
            for g, kind in enumerate(self.kinds):
                if kind == "mamba":
                    b = self.state_block(tables[g], end)
                    assert b != NULL, f"{req_id}: state after {end} tokens into null"
                    for layer in self.group_layers[g]:
                        s = self.expected_state(r, end, layer) if right else \
                            torch.full((self.state_bytes,), -7, dtype=torch.int8)
                        self.write_state(b, layer, s)
                    self.states[(req_id, end)] = b
                    continue
                for b in range(start // BLOCK, (end - 1) // BLOCK + 1):
                    assert tables[g][b] != NULL, f"{req_id}: computing block {b} into null"
                    for layer in self.group_layers[g]:
                        if right and b < len(r.block_hashes) and (b + 1) * BLOCK <= end:
                            self.write_kv(tables[g][b], layer, pattern(self.bh(r, b), layer))
                        else:
                            self.write_kv(tables[g][b], layer,
                                          torch.full((HEADS, BLOCK, 2 * HEAD), -7,
                                                     dtype=torch.int16))

    def execute(self, so, before_forward=None):
        """As vLLM's model runner with Mamba layers: the blocks handed out
        this step are zeroed first (update_requests, before any connector
        call of the step), then the step runs."""
        for b in so.new_block_ids_to_zero or ():
            for v in self.views.values():
                v[b].zero_()
        return super().execute(so, before_forward)
