"""KvbmConnector's worker side: the Python overhead per save_kv_layer and
wait_for_layer_load call, and per engine step of 32 layers, beside a bare
ctypes call (kvbm_version, no errcheck) measured in the same run. The
connector is vLLM's own (built by its factory over KV views made by
vLLM's create_kv_cache_views) on the emulated device. Needs vllm
(make bench-vllm). Not a test: it prints figures, it asserts none."""
import ctypes
import gc
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("KVBM_DEVICE", "emulated")

import torch  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import ForwardContext  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, KVCacheTensor,
                                        compute_layout_strides, create_kv_cache_views)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from kvbmgo._lib import lib  # noqa: E402
from kvbmgo.vllm.metadata import BlockLoad, BlockStore, KvbmConnectorMetadata  # noqa: E402

MODEL = os.path.join(os.path.dirname(__file__), "..", "tests", "vllm_connector", "tiny-llama")
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(32)]
BLOCK, HEADS, HEAD, NUM_BLOCKS = 16, 2, 16, 64


def worker_connector():
    mc = ModelConfig(model=MODEL, tokenizer=MODEL, skip_tokenizer_init=True, dtype="float16",
                     seed=42)
    sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=2048,
                         enable_chunked_prefill=True, is_encoder_decoder=False)
    cc = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, cache_dtype="auto",
                     enable_prefix_caching=True)
    kt = KVTransferConfig(kv_connector="KvbmConnector", kv_connector_module_path="kvbmgo.vllm",
                          kv_role="kv_both", kv_connector_extra_config={"g2_blocks": 32})
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc, kv_transfer_config=kt,
                    device_config=DeviceConfig("cpu"))
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                             dtype=torch.float16)
    lay = KVCacheLayout.LBNHC
    ls, bs, *_ = compute_layout_strides(spec, NUM_BLOCKS, len(LAYERS), lay)
    size = NUM_BLOCKS * len(LAYERS) * spec.page_size_bytes
    tensor = KVCacheTensor(size=size, layers=list(LAYERS), layer_stride=ls, block_stride=bs)
    kvc = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[tensor],
                        kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])
    vc.cache_config.num_gpu_blocks = NUM_BLOCKS
    raw = torch.zeros(size, dtype=torch.int8)
    views = dict(zip(LAYERS, create_kv_cache_views(raw, spec, NUM_BLOCKS, lay, tensor)))
    w = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kvc)
    w.register_kv_caches(views)
    return w, views


def per_call_ns(fn, n=100_000, rounds=5):
    """The best of rounds of n calls, per call, minus an empty loop's."""
    def loop(f):
        best = float("inf")
        for _ in range(rounds):
            t = time.perf_counter_ns()
            for _ in range(n):
                f()
            best = min(best, (time.perf_counter_ns() - t) / n)
        return best
    return loop(fn) - loop(lambda: None)


def main():
    gc.disable()
    w, views = worker_connector()
    ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
    raw = ctypes.CDLL(lib.path).kvbm_version
    raw.restype, raw.argtypes = ctypes.c_uint32, []
    bare = per_call_ns(raw)
    name, kv = LAYERS[5], views[LAYERS[5]]

    empty = KvbmConnectorMetadata()
    w.bind_connector_metadata(empty)
    w.start_load_kv(ctx)
    save = per_call_ns(lambda: w.save_kv_layer(name, kv, None))
    wait_idle = per_call_ns(lambda: w.wait_for_layer_load(name))
    w.wait_for_save()
    w.clear_connector_metadata()

    # A step that loads a block layer by layer: each wait_for_layer_load
    # waits on its layer's event (already complete when timed: the overhead).
    key = b"k" * 32
    w.bind_connector_metadata(KvbmConnectorMetadata(stores=[BlockStore("s", [key], [1])]))
    w.start_load_kv(ctx)
    w.wait_for_save()
    w.get_finished(set())
    w.clear_connector_metadata()
    time.sleep(0.05)
    w.get_finished(set())
    w.bind_connector_metadata(KvbmConnectorMetadata(loads=[BlockLoad("l", [key], [2])]))
    w.start_load_kv(ctx)
    for layer in LAYERS:
        w.wait_for_layer_load(layer)
    wait_loaded = per_call_ns(lambda: w.wait_for_layer_load(name), n=20_000)
    w.wait_for_save()
    assert not w.get_block_ids_with_load_errors()
    w.clear_connector_metadata()

    def step(md):  # the connector's calls of one step, as vLLM's model runner makes them
        w.handle_preemptions(md)
        w.bind_connector_metadata(md)
        w.start_load_kv(ctx)
        for layer in LAYERS:
            w.wait_for_layer_load(layer)
            w.save_kv_layer(layer, kv, None)
        w.wait_for_save()
        w.get_finished(set())
        w.get_block_ids_with_load_errors()
        w.get_kv_connector_stats()
        w.build_connector_worker_meta()
        w.clear_connector_metadata()

    def timed_steps(make_md, n):
        times = []
        for _ in range(n):
            md = make_md()
            t = time.perf_counter_ns()
            step(md)
            times.append(time.perf_counter_ns() - t)
        return statistics.median(times)

    empty_step = timed_steps(KvbmConnectorMetadata, 2_000)
    load_step = timed_steps(lambda: KvbmConnectorMetadata(loads=[BlockLoad("l", [key], [2])]),
                            300)
    w.shutdown()

    print(f"bare ctypes call (kvbm_version, no errcheck): {bare:8.0f} ns")
    rows = [
        ("save_kv_layer (stores go at wait_for_save)", save, 10_000),
        ("wait_for_layer_load, no load this step", wait_idle, 10_000),
        ("wait_for_layer_load, its layer's load done", wait_loaded, 10_000),
    ]
    for label, ns, limit in rows:
        print(f"{label:<48}{ns:8.0f} ns/call  ({ns / bare:5.1f}x bare; target <= "
              f"{limit / 1000:.0f} us)")
    print(f"{'32-layer step, nothing to move':<48}{empty_step / 1000:8.1f} us/step "
          f"({empty_step / bare:5.0f}x bare; target <= 500 us beyond the copies)")
    print(f"{'32-layer step, 1-block layer-wise load':<48}{load_step / 1000:8.1f} us/step "
          f"({load_step / bare:5.0f}x bare; copies and their waits included)")


if __name__ == "__main__":
    main()
