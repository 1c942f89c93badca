"""A vLLM (0.33 or 0.34) engine at tensor-parallel size tp, from its pieces: one real
Scheduler (its VllmConfig at that TP size) and tp worker connectors, each
made by vLLM's factory as rank r and registering its own KV views (made by
vLLM's create_kv_cache_views, with that rank's KV heads); their outputs are
aggregated by vLLM's KVOutputAggregator, as the executor does.

The "forward" writes every scheduled block of every layer as a slice of one
global KV pattern, [all KV heads, tokens, content], derived from (request,
block, end of the step's span): rank r writes the heads vLLM gives it (rank
r of tp holds total/tp heads, or head r*total//tp when tp > total; MLA: the
one latent head, the same on every rank). So a hand-over between TP sizes
is checked byte for byte: the heads a decode rank holds must be the slice
of the global KV the prefill ranks held.

With window=W, a hybrid model's KV cache, as hybrid_harness.py lays it
out: a full-attention group (layers 0, 2) and a sliding window of W tokens
(layers 1, 3), both with the rank's heads, aliasing the same pages, vLLM's
hybrid KV cache manager on; the forward writes each group's blocks in its
own layers."""
import contextlib
import copy
import json
import os
import time
import zlib

from harness import require_vllm

require_vllm()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,  # noqa: E402
                         ParallelConfig, SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import ForwardContext  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, KVCacheTensor, MLAAttentionSpec,
                                        SlidingWindowSpec, compute_layout_strides,
                                        create_kv_cache_views)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from harness import model_runner_output, post_forward, pre_forward  # noqa: E402

import kvbmgo.vllm.connector as connector_module  # noqa: E402
from harness import BLOCK, EOS, HEAD, LAYERS, MODEL, _hasher  # noqa: E402
import hybrid_harness  # noqa: E402

MLA_CONTENT = 32  # the latent's width (kv_lora_rank + rope dims) in the MLA model


def model_dir(tmp_path, kv_heads=2, mla=False):
    """A model directory (config.json only): the tiny Llama, with kv_heads
    KV heads, or a tiny DeepSeek-V2 (MLA)."""
    if not mla and kv_heads == 2:
        return MODEL
    with open(os.path.join(MODEL, "config.json")) as f:
        cfg = json.load(f)
    if mla:
        cfg.update(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
                   num_key_value_heads=4, moe_intermediate_size=64, kv_lora_rank=16,
                   qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
                   first_k_dense_replace=2)
    else:
        cfg.update(num_attention_heads=kv_heads, num_key_value_heads=kv_heads,
                   hidden_size=16 * kv_heads)
    d = tmp_path / ("mla" if mla else f"kv{kv_heads}")
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def rank_heads(rank, tp, total, mla):
    """The global KV heads of rank (vLLM's sharding; written out here, not
    taken from the code under test)."""
    if mla:
        return list(range(1))
    if tp <= total:
        return list(range(rank * total // tp, (rank + 1) * total // tp))
    return [rank * total // tp]


def kv_views(spec, layout, num_blocks):
    """One rank's KV views as vLLM makes them: ({layer: view}, the
    KVCacheConfig, the raw buffer)."""
    lay = KVCacheLayout[layout]
    ls, bs, *_ = compute_layout_strides(spec, num_blocks, len(LAYERS), lay)
    size = num_blocks * len(LAYERS) * spec.page_size_bytes
    tensor = KVCacheTensor(size=size, layers=list(LAYERS), layer_stride=ls, block_stride=bs)
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[tensor],
                        kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])
    raw = torch.zeros(size, dtype=torch.int8)
    return dict(zip(LAYERS, create_kv_cache_views(raw, spec, num_blocks, lay, tensor))), kvc, raw


def hybrid_kv_views(specs, layout, num_blocks):
    """One rank's KV views of a hybrid model (hybrid_harness's layout: a
    tensor per group, all from byte 0 of one buffer): ({layer: view}, the
    KVCacheConfig, the raw buffer)."""
    lay = KVCacheLayout[layout]
    size = num_blocks * 2 * specs[0].page_size_bytes
    tensors, groups = [], []
    for spec, idx in zip(specs, hybrid_harness.GROUP_LAYERS):
        names = [hybrid_harness.LAYERS[i] for i in idx]
        ls, bs, *_ = compute_layout_strides(spec, num_blocks, len(names), lay)
        tensors.append(KVCacheTensor(size=size, layers=names, layer_stride=ls, block_stride=bs,
                                     offset=0))
        groups.append(KVCacheGroupSpec(names, spec))
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors,
                        kv_cache_groups=groups, hash_block_size=BLOCK)
    raw = torch.zeros(size, dtype=torch.int8)
    views = {}
    for spec, t in zip(specs, tensors):
        views.update(zip(t.layers, create_kv_cache_views(raw, spec, num_blocks, lay, t)))
    return views, kvc, raw


def global_kv(seed, layer, heads, content):
    """A block's KV over every head, [heads, tokens, content] as int16."""
    rng = np.random.default_rng(seed * 7919 + layer)
    return torch.from_numpy(rng.integers(-32768, 32767, size=(heads, BLOCK, content),
                                         dtype=np.int16))


@contextlib.contextmanager
def as_rank(r):
    """The connector asks vLLM's TP group for its rank; there is none here."""
    saved = connector_module._rank
    connector_module._rank = lambda: r
    try:
        yield
    finally:
        connector_module._rank = saved


class TpEngine:
    def __init__(self, model, tp, extra=None, *, role="kv_both", engine_id=None,
                 layout="LBNHC", num_blocks=32, policy="fail", window=0):
        """layout: vLLM's KV cache layout name, or one per rank. window: a
        sliding window group of that many tokens beside the full one (0: one
        group)."""
        self.tp = tp
        self.layers = hybrid_harness.LAYERS if window else LAYERS
        self.group_layers = hybrid_harness.GROUP_LAYERS if window else [range(len(LAYERS))]
        mc = ModelConfig(model=model, tokenizer=model, skip_tokenizer_init=True,
                         dtype="float16", seed=42)
        self.mla = bool(mc.use_mla)
        self.total = int(mc.get_total_num_kv_heads())
        sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=2048,
                             enable_chunked_prefill=True, is_encoder_decoder=False)
        cc = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, cache_dtype="auto",
                         enable_prefix_caching=True)
        kt = KVTransferConfig(kv_connector="KvbmConnector", kv_connector_module_path="kvbmgo.vllm",
                              kv_role=role, engine_id=engine_id, kv_load_failure_policy=policy,
                              kv_connector_extra_config=dict(extra or {}))
        platform = hybrid_harness.hybrid_platform() if window else contextlib.nullcontext()
        with platform:  # HMA on: the hybrid platform, as on CUDA
            self.vc = vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc,
                                      kv_transfer_config=kt, device_config=DeviceConfig("cpu"),
                                      parallel_config=ParallelConfig(tensor_parallel_size=tp))
        heads = 1 if self.mla else max(1, self.total // tp)
        if self.mla:
            self.content = MLA_CONTENT
            spec = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=MLA_CONTENT,
                                    dtype=torch.float16)
        else:
            self.content = 2 * HEAD
            spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=heads, head_size=HEAD,
                                     dtype=torch.float16)
        layouts = [layout] * tp if isinstance(layout, str) else list(layout)
        self.views, self.workers, self.raws = [], [], []
        vc.cache_config.num_gpu_blocks = num_blocks
        for r in range(tp):
            if window:
                specs = [spec, SlidingWindowSpec(block_size=BLOCK, num_kv_heads=heads,
                                                 head_size=HEAD, dtype=torch.float16,
                                                 sliding_window=window)]
                views, kvc, raw = hybrid_kv_views(specs, layouts[r], num_blocks)
            else:
                views, kvc, raw = kv_views(spec, layouts[r], num_blocks)
            with as_rank(r):
                w = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kvc)
            w.register_kv_caches(views)
            self.raws.append(raw)
            self.views.append(views)
            self.workers.append(w)
            if r == 0:
                self.kvc = kvc
        self.sched = Scheduler(vllm_config=vc, kv_cache_config=self.kvc, log_stats=True,
                               structured_output_manager=StructuredOutputManager(vc),
                               block_size=BLOCK, hash_block_size=BLOCK)
        self.agg = KVOutputAggregator(tp)
        self.ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
        self.outputs = []   # the aggregated KVConnectorOutputs
        self.finished = {}  # req_id -> the EngineCoreOutput that finished it

    def close(self):
        for w in self.workers:
            w.shutdown()

    def add(self, req_id, prompt, max_tokens=1, kv_transfer_params=None):
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                            extra_args=({"kv_transfer_params": dict(kv_transfer_params)}
                                        if kv_transfer_params is not None else None))
        sp.update_from_generation_config({}, EOS)
        r = Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=sp,
                    pooling_params=None, block_hasher=_hasher)
        self.sched.add_request(r)
        return r

    def block_ids(self, req_id):
        return self.tables(req_id)[0]

    def tables(self, req_id):
        """The request's block table per group (null blocks included)."""
        return [list(t) for t in self.sched.kv_cache_manager.get_block_ids(req_id)]

    def read(self, rank, block_id, layer):
        """Rank's G1 block of one layer: [its heads, tokens, content] as int16."""
        return self.views[rank][self.layers[layer]][block_id].view(torch.int16).clone()

    def global_kv(self, seed, layer):
        return global_kv(seed, layer, 1 if self.mla else self.total, self.content)

    def assembled(self, block_id, layer):
        """The global KV of a block as this engine's ranks hold it; ranks that
        hold the same head (replicated) must agree."""
        heads = 1 if self.mla else self.total
        out = torch.full((heads, BLOCK, self.content), 0, dtype=torch.int16)
        seen = set()
        for q in range(self.tp):
            kv = self.read(q, block_id, layer)
            for i, g in enumerate(rank_heads(q, self.tp, self.total, self.mla)):
                if g in seen:
                    assert torch.equal(out[g], kv[i]), f"replicas of head {g} differ"
                out[g] = kv[i]
                seen.add(g)
        assert seen == set(range(heads))
        return out

    @staticmethod
    def spans(so):
        out = {new.req_id: new.num_computed_tokens for new in so.scheduled_new_reqs}
        c = so.scheduled_cached_reqs
        out.update(zip(c.req_ids, c.num_computed_tokens))
        return {r: (s, s + so.num_scheduled_tokens[r]) for r, s in out.items()
                if r in so.num_scheduled_tokens}

    def forward(self, so):
        for req_id, (start, end) in self.spans(so).items():
            for ids, layers in zip(self.tables(req_id), self.group_layers):
                for b in range(start // BLOCK, (end - 1) // BLOCK + 1):
                    assert ids[b] != 0, f"{req_id}: computing block {b} into the null block"
                    seed = zlib.crc32(f"{req_id}/{b}/{end}".encode())
                    for layer in layers:
                        g = self.global_kv(seed, layer)
                        for r in range(self.tp):
                            mine = g[rank_heads(r, self.tp, self.total, self.mla)]
                            self.views[r][self.layers[layer]][ids[b]].view(torch.int16) \
                                .copy_(mine)

    def step(self, before_forward=None):
        """One step on every rank, each driving its connector as vLLM's
        ActiveKVConnector does (harness.pre_forward / post_forward;
        no_forward when nothing is scheduled)."""
        so = self.sched.schedule()
        empty = not so.total_num_scheduled_tokens
        pending = [pre_forward(w, so, self.ctx, forward=not empty) for w in self.workers]
        if not empty:
            for w in self.workers:
                for name in self.layers:
                    w.wait_for_layer_load(name)
        if before_forward is not None:  # the test's hook sees every step
            before_forward(so)
        if not empty:
            self.forward(so)
        req_ids = list(so.num_scheduled_tokens)
        outs = []
        for w, p in zip(self.workers, pending):
            kvo = post_forward(w, so, self.ctx, p)
            if empty:
                # A copy: each rank's output reaches the executor as its own
                # object (EMPTY_MODEL_RUNNER_OUTPUT is shared).
                outs.append(copy.copy(ModelRunnerOutput.with_kv_conn_output_only(kvo)))
                continue
            sampled = []
            for rid in req_ids:
                r = self.sched.requests[rid]
                sampled.append([7] if self.spans(so)[rid][1] >= r.num_tokens else [])
            outs.append(model_runner_output(req_ids, sampled, kvo))
        out = self.agg.aggregate(outs)
        self.outputs.append(out.kv_connector_output or KVConnectorOutput())
        for o in self.sched.update_from_output(so, out).values():
            for x in o.outputs:
                if x.finish_reason is not None:
                    self.finished[x.request_id] = x
        return so


def run_both(p, d, before_forward=None, timeout=30.0):
    """Steps both engines until neither holds a request."""
    deadline = time.monotonic() + timeout
    while p.sched.has_requests() or d.sched.has_requests():
        assert time.monotonic() < deadline, \
            f"left: prefill {list(p.sched.requests)}, decode {list(d.sched.requests)}"
        busy = False
        if p.sched.has_requests():
            busy |= bool(p.step().num_scheduled_tokens)
        if d.sched.has_requests():
            busy |= bool(d.step(before_forward).num_scheduled_tokens)
        if not busy:
            time.sleep(0.001)
