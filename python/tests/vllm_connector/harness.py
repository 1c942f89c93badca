"""A real vLLM (0.33 or 0.34) Scheduler built offline (a tiny local Llama
config), KvbmConnector loaded by vLLM's factory through
kv_connector_module_path, and its worker side over KV views made by vLLM's
own create_kv_cache_views on the emulated device. Engine.step() runs one
step as vLLM's model runner drives a connector (v1/worker/gpu/kv_connector.py,
ActiveKVConnector: pre_forward, finish_forward, post_forward; no_forward on a
step that schedules no token), with a "forward" that writes each computed
full block's KV as a pattern derived from its block hash, so every loaded
byte can be checked. What differs between the releases is feature-detected
(model_runner_output)."""
import dataclasses
import os

import pytest


def require_vllm():
    """Skips the calling module without vllm, or fails it when
    KVBM_REQUIRE_ENGINES=1."""
    try:
        import vllm.config  # noqa: F401 - a real vllm, not a directory named so
    except Exception as e:  # noqa: BLE001 - any import failure is a reason
        reason = (f"vllm is not importable ({type(e).__name__}: {e}); "
                  f"`make test-vllm` runs these tests in the engine venv")
        if os.environ.get("KVBM_REQUIRE_ENGINES") == "1":
            raise RuntimeError(f"KVBM_REQUIRE_ENGINES=1: {reason}") from e
        pytest.skip(reason, allow_module_level=True)


require_vllm()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import ForwardContext  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, KVCacheTensor,
                                        compute_layout_strides, create_kv_cache_views)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

MODEL = os.path.join(os.path.dirname(__file__), "tiny-llama")
BLOCK, HEADS, HEAD = 16, 2, 16  # the tiny Llama: 4 heads of 16 dims, 2 KV heads
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
EOS = 2

init_none_hash(sha256)
_hasher = get_request_block_hasher(BLOCK, sha256)


#: ModelRunnerOutput.req_id_to_index: required in 0.33, gone in 0.34.
_RUNNER_OUTPUT_HAS_INDEX = "req_id_to_index" in {f.name for f in
                                                 dataclasses.fields(ModelRunnerOutput)}


def model_runner_output(req_ids, sampled, kvo):
    """A ModelRunnerOutput of this vLLM for req_ids' sampled tokens."""
    kw = dict(req_ids=req_ids, sampled_token_ids=sampled, logprobs=None,
              prompt_logprobs_dict={}, pooler_output=None, kv_connector_output=kvo)
    if _RUNNER_OUTPUT_HAS_INDEX:
        kw["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
    return ModelRunnerOutput(**kw)


def pre_forward(w, so, ctx, forward=True):
    """ActiveKVConnector.pre_forward: handle_preemptions, bind, and a sync
    load before the forward. Returns start_load_kv's keyword arguments when
    the load is left for post_forward (an async one), else None. forward:
    False for no_forward's call (no input batch: no keyword arguments)."""
    md = so.kv_connector_metadata
    assert md is not None
    w.handle_preemptions(md)
    w.bind_connector_metadata(md)
    kwargs = {}
    if forward:  # _build_load_kwargs, from the input batch the runner made
        req_ids = list(so.num_scheduled_tokens)
        kwargs = dict(scheduler_output=so, request_state_indices=list(range(len(req_ids))),
                      request_ids=req_ids, num_tokens=so.total_num_scheduled_tokens)
    if so.has_sync_kv_loads:
        w.start_load_kv(ctx, **kwargs)
        return None
    return kwargs


def post_forward(w, so, ctx, pending, after_save=None):
    """ActiveKVConnector.finish_forward and post_forward (defer_finalize
    off): the deferred load, wait_for_save, the step's transfer results and
    clear_connector_metadata. Returns the KVConnectorOutput."""
    w.finish_forward()
    if pending is not None:
        w.start_load_kv(ctx, **pending)
    w.wait_for_save()
    if after_save is not None:
        after_save()
    tr = w.get_transfer_results(so.finished_req_ids)
    kvo = KVConnectorOutput()
    kvo.finished_sending = tr.finished_sending or None
    kvo.finished_recving = tr.finished_recving or None
    kvo.failed_recving = tr.failed_recving
    kvo.invalid_block_ids = w.get_block_ids_with_load_errors()
    kvo.kv_connector_stats = w.get_kv_connector_stats()
    kvo.kv_cache_events = w.get_kv_connector_kv_cache_events()
    kvo.kv_connector_worker_meta = w.build_connector_worker_meta()
    w.clear_connector_metadata()
    return kvo


def pattern(key: bytes, layer: int) -> torch.Tensor:
    """The KV of one block of one layer, as int16, derived from its block hash."""
    rng = np.random.default_rng(int.from_bytes(bytes(key)[:8], "little") + 7919 * layer)
    return torch.from_numpy(rng.integers(-32768, 32767, size=(HEADS, BLOCK, 2 * HEAD),
                                         dtype=np.int16))


class Engine:
    """One scheduler and one worker connector, in one process."""

    #: What hashes a request's tokens (vLLM's, at BLOCK tokens).
    hasher = staticmethod(_hasher)

    def __init__(self, extra=None, *, layout="LBNHC", num_blocks=64, policy="recompute",
                 max_batched=64, serial=False, role="kv_both", engine_id=None,
                 pipelined=False, alloc=None):
        """serial: each step waits until the cache moves nothing before the
        next (tests whose outcome would depend on G2 stores in flight).
        role, engine_id: the KVTransferConfig's (P/D). pipelined: vLLM's
        AsyncScheduler, run with run_pipelined(). alloc(size): the int8
        tensor the KV cache lives in (default: torch.zeros)."""
        self.serial = serial
        self.verify = False  # check_computed before every forward
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
        self.vc = vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc,
                                  kv_transfer_config=kt, device_config=DeviceConfig("cpu"))
        self.spec = spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS,
                                             head_size=HEAD, dtype=torch.float16)
        lay = KVCacheLayout[layout]
        ls, bs, *_ = compute_layout_strides(spec, num_blocks, len(LAYERS), lay)
        size = num_blocks * len(LAYERS) * spec.page_size_bytes
        tensor = KVCacheTensor(size=size, layers=list(LAYERS), layer_stride=ls, block_stride=bs)
        self.kvc = kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[tensor],
                                       kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])
        vc.cache_config.num_gpu_blocks = num_blocks
        self.raw = torch.zeros(size, dtype=torch.int8) if alloc is None else alloc(size)
        self.views = dict(zip(LAYERS, create_kv_cache_views(self.raw, spec, num_blocks, lay,
                                                            tensor)))
        self.pipelined = pipelined
        sched_cls = AsyncScheduler if pipelined else Scheduler
        self.sched = sched_cls(vllm_config=vc, kv_cache_config=kvc, log_stats=True,
                               structured_output_manager=StructuredOutputManager(vc),
                               block_size=BLOCK)
        self.worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kvc)
        self.worker.register_kv_caches(self.views)
        self.ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
        self.events = []  # what the scheduler side's take_events() yielded
        self.outputs = []
        #: req_id -> the EngineCoreOutput that finished it (finish_reason,
        #: kv_transfer_params).
        self.finished = {}
        #: The kv_connector_stats payloads vLLM's SchedulerStats carried.
        self.stats = []

    @property
    def connector(self):
        """The scheduler-side connector."""
        return self.sched.connector

    def close(self):
        self.worker.shutdown()

    def add(self, req_id, prompt, max_tokens=1, kv_transfer_params=None):
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                            extra_args=({"kv_transfer_params": dict(kv_transfer_params)}
                                        if kv_transfer_params is not None else None))
        sp.update_from_generation_config({}, EOS)
        r = Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=sp,
                    pooling_params=None, block_hasher=self.hasher)
        self.sched.add_request(r)
        return r

    def block_ids(self, req_id):
        return list(self.sched.kv_cache_manager.get_block_ids(req_id)[0])

    def read(self, block_id, layer):
        return self.views[LAYERS[layer]][block_id].view(torch.int16).clone()

    def write(self, block_id, layer, data):
        self.views[LAYERS[layer]][block_id].view(torch.int16).copy_(data)

    @staticmethod
    def spans(so):
        """req_id -> (tokens computed before this step, after it), from the
        scheduler output alone (with async scheduling the requests have
        moved on already)."""
        out = {new.req_id: new.num_computed_tokens for new in so.scheduled_new_reqs}
        c = so.scheduled_cached_reqs
        out.update(zip(c.req_ids, c.num_computed_tokens))
        return {r: (s, s + so.num_scheduled_tokens[r]) for r, s in out.items()
                if r in so.num_scheduled_tokens}

    def check_computed(self, so):
        """Every full block a scheduled request has computed already (GPU
        hit, kvbm load, or an earlier step) holds its KV, in every layer."""
        for req_id, (start, _) in self.spans(so).items():
            r = self.sched.requests[req_id]
            ids = self.block_ids(req_id)
            for b in range(start // BLOCK):
                for layer in range(len(LAYERS)):
                    assert torch.equal(self.read(ids[b], layer),
                                       pattern(r.block_hashes[b], layer)), \
                        f"{req_id} block {b} (G1 {ids[b]}) layer {layer}"

    def holds_its_kv(self, r, ids, b):
        """G1 block ids[b] holds block b of request r, in every layer."""
        return all(torch.equal(self.read(ids[b], layer), pattern(r.block_hashes[b], layer))
                   for layer in range(len(LAYERS)))

    def forward(self, so):
        """Writes the KV of every token scheduled this step: each full block
        gets its pattern, a partial one junk. As attention would, a block
        computed over an earlier block that does not hold its KV (a failed
        load) is wrong too: junk."""
        for req_id, (start, end) in self.spans(so).items():
            r = self.sched.requests[req_id]
            ids = self.block_ids(req_id)
            right = all(self.holds_its_kv(r, ids, b)
                        for b in range(min(start // BLOCK, len(r.block_hashes))))
            for b in range(start // BLOCK, (end - 1) // BLOCK + 1):
                for layer in range(len(LAYERS)):
                    if right and b < len(r.block_hashes) and (b + 1) * BLOCK <= end:
                        self.write(ids[b], layer, pattern(r.block_hashes[b], layer))
                    else:
                        self.write(ids[b], layer, torch.full((HEADS, BLOCK, 2 * HEAD), -7,
                                                             dtype=torch.int16))

    def step(self, before_forward=None):
        """One engine step; before_forward(so) sees G1 after the step's loads."""
        so = self.sched.schedule()
        kvo = self.record(so, self.execute(so, before_forward))
        return so, kvo

    def execute(self, so, before_forward=None):
        """What vLLM's model runner does with one scheduler output, as its
        ActiveKVConnector orders the connector's calls (no_forward when
        nothing is scheduled); returns the ModelRunnerOutput."""
        w = self.worker
        after_save = self.idle if self.serial else None
        if not so.total_num_scheduled_tokens:  # ActiveKVConnector.no_forward
            pre_forward(w, so, self.ctx, forward=False)
            if before_forward is not None:  # the test's hook sees every step
                before_forward(so)
            kvo = post_forward(w, so, self.ctx, None, after_save)
            return ModelRunnerOutput.with_kv_conn_output_only(kvo)
        pending = pre_forward(w, so, self.ctx)
        for name in LAYERS:  # what each attention layer does before attention
            w.wait_for_layer_load(name)
        if self.verify:
            self.check_computed(so)
        if before_forward is not None:
            before_forward(so)
        self.forward(so)
        kvo = post_forward(w, so, self.ctx, pending, after_save)
        spans = self.spans(so)
        req_ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            r = self.sched.requests[rid]
            # With async scheduling a step is run before the last one's
            # token is known: every step past the prompt samples.
            last = r.num_prompt_tokens if self.pipelined else r.num_tokens
            sampled.append([7] if spans[rid][1] >= last else [])
        return model_runner_output(req_ids, sampled, kvo)

    def record(self, so, out):
        """Feeds a step's output to the scheduler (update_from_output)."""
        # An empty step's output carries no KVConnectorOutput when it has
        # nothing to say (with_kv_conn_output_only): recorded as an empty one.
        kvo = out.kv_connector_output or KVConnectorOutput()
        self.outputs.append(kvo)
        for outs in self.sched.update_from_output(so, out).values():
            if outs.scheduler_stats is not None and outs.scheduler_stats.kv_connector_stats:
                self.stats.append(outs.scheduler_stats.kv_connector_stats)
            for o in outs.outputs:
                if o.finish_reason is not None:
                    self.finished[o.request_id] = o
        return kvo

    def run_pipelined(self, timeout=20.0):
        """run() with async scheduling: step N+1 is scheduled and run
        before step N's output reaches the scheduler, as vLLM's
        AsyncScheduler does (pipelined=True)."""
        import time
        deadline = time.monotonic() + timeout
        pending = None
        while self.sched.has_requests() or pending is not None:
            assert time.monotonic() < deadline, f"requests left: {list(self.sched.requests)}"
            so = self.sched.schedule() if self.sched.has_requests() else None
            out = self.execute(so) if so is not None else None
            if pending is not None:
                self.record(*pending)
            pending = (so, out) if so is not None else None

    def idle(self, timeout=10.0):
        """Waits until the cache moves nothing (write-backs to G3 included)."""
        import time
        cache = self.worker._worker.worker.cache
        deadline = time.monotonic() + timeout
        while True:
            st = cache.stats()
            if st.g2.in_flight == 0 and st.g3.in_flight == 0:
                break
            assert time.monotonic() < deadline, f"cache still busy: {st}"
            time.sleep(0.005)

    def settle(self):
        """idle(), then a step, so the scheduler side hears every event."""
        self.idle()
        self.step()

    def run(self, before_forward=None, timeout=20.0):
        """Steps until the scheduler holds no request (blocks held for
        stores included), as an engine's busy loop does; steps that
        schedule nothing sleep a millisecond."""
        import time
        deadline = time.monotonic() + timeout
        while self.sched.has_requests():
            assert time.monotonic() < deadline, \
                f"requests left after {timeout} s: {list(self.sched.requests)}"
            so, _ = self.step(before_forward)
            if not so.num_scheduled_tokens:
                time.sleep(0.001)


def on_a_free_port(make, tries=5):
    """make(port) on a port free a moment ago; again on another if something
    took it meanwhile (a side channel that binds fails with EADDRINUSE)."""
    import socket
    for i in range(tries):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            return make(port)
        except OSError as e:
            if "Address already in use" not in str(e) or i == tries - 1:
                raise
