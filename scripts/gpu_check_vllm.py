"""GPU check of the vLLM connector's worker side (kvbmgo.vllm.worker), run
by scripts/gpu-check.sh with KVBM_DEVICE=cuda: kv_both offload, then
layer-wise onboard, on CUDA tensors laid out as vLLM 0.33's per-layer KV
views (LBNHC: [num_blocks, kv_heads, block_size, 2*head_size], strided),
with real torch events.

1. Offload: the "forward" writes blocks 0..7 of every layer on the current
   stream behind a long sleep kernel; wait_for_save records an event after
   it and the G1->G2 store must wait for that event (else it reads zeros).
2. G1 is zeroed; a load of the same keys into blocks 8..15 runs layer by
   layer; for each layer the current stream waits (wait_for_layer_load)
   and then compares the layer with what was written. Every layer of every
   block must match; no block may be reported failed.
3. Sleep mode: unregister_kv_caches, then the KV tensor is freed and the
   allocator's cache emptied (the memory really goes back to the driver);
   a load is refused (every block failed), nothing faults. A new tensor at
   another address takes its place (as after a wake-up without the
   extensible cache, the views are rebuilt), restore_kv_caches' register
   of the new views, and the load of the same keys from G2 is byte-exact.

The machine may have torch without vllm: then the two vllm classes the
worker side imports (KVConnectorMetadata, KVConnectorWorkerMetadata) are
stood in for, since the worker side touches nothing else of vllm.
"""
import os
import sys
import time
import types

try:
    import torch
except Exception as e:  # noqa: BLE001
    sys.exit(f"gpu_check_vllm.py needs PyTorch with CUDA: import torch failed: "
             f"{type(e).__name__}: {e}")
if not torch.cuda.is_available():
    sys.exit(f"gpu_check_vllm.py needs PyTorch with CUDA: torch {torch.__version__} sees "
             f"no CUDA device")

try:
    import vllm.distributed.kv_transfer.kv_connector.v1.base  # noqa: F401
    print("vllm:", __import__("vllm").__version__, flush=True)
except Exception as e:  # noqa: BLE001 - no vllm here: stand in for its two base classes
    print(f"vllm not importable ({type(e).__name__}); standing in for its metadata base "
          f"classes", flush=True)
    base = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.base")

    class KVConnectorMetadata:  # noqa: D401 - vLLM's is an empty ABC
        pass

    class KVConnectorWorkerMetadata:
        pass
    base.KVConnectorMetadata = KVConnectorMetadata
    base.KVConnectorWorkerMetadata = KVConnectorWorkerMetadata
    parts = "vllm.distributed.kv_transfer.kv_connector.v1.base".split(".")
    for i in range(1, len(parts)):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    sys.modules[base.__name__] = base

import kvbmgo  # noqa: E402
from kvbmgo.vllm.config import KvbmConfig  # noqa: E402
from kvbmgo.vllm.kv_views import g1_layout  # noqa: E402
from kvbmgo.vllm.metadata import BlockLoad, BlockStore, KvbmConnectorMetadata  # noqa: E402
from kvbmgo.vllm.worker import KvbmWorker  # noqa: E402

LAYERS, NUM_BLOCKS, BLOCK, HEADS, HEAD = 8, 32, 16, 8, 128
dev = torch.device("cuda:0")
print("kvbm info:", kvbmgo.info(), "; PYTORCH_CUDA_ALLOC_CONF:",
      os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(unset)"), flush=True)

# LBNHC: memory [layer][block][token][head][k|v], each layer viewed as
# [block, head, token, 2*head_size] (vLLM's create_kv_cache_views).
raw = torch.zeros(LAYERS, NUM_BLOCKS, BLOCK, HEADS, 2 * HEAD, dtype=torch.float16, device=dev)
names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
views = {n: raw[i].permute(0, 2, 1, 3) for i, n in enumerate(names)}
assert not views[names[0]].is_contiguous()
src, dst = list(range(8)), list(range(8, 16))
keys = [f"gpu-check-block-{i}".encode() for i in src]

kw = KvbmWorker(KvbmConfig(g2_blocks=64), rank=0, engine_id="gpu-check")
status = 0
try:
    kw.register_kv_caches(views)
    assert kw._cuda, "the worker side did not see CUDA tensors"

    # 1. Offload, ordered after the forward's writes.
    md = KvbmConnectorMetadata(stores=[BlockStore("A", keys, src)], held=["A"])
    kw.bind()
    kw.start_load_kv(md)
    gen = torch.Generator(device=dev).manual_seed(7)
    want = torch.randn(LAYERS, len(src), BLOCK, HEADS, 2 * HEAD, dtype=torch.float16,
                       device=dev, generator=gen)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)   # ~0.1 s on the current stream before the writes
    raw[:, src] = want
    kw.wait_for_save(md)
    t0 = time.monotonic()
    sent = None
    while not sent:
        sent, _ = kw.get_finished()
        assert time.monotonic() - t0 < 30, "the store did not finish in 30 s"
        time.sleep(0.001)
    torch.cuda.synchronize()
    stats = kw.worker.cache.stats()
    print(f"offload: {len(src)} blocks of {LAYERS} layers stored ({stats})", flush=True)

    # 2. Layer-wise onboard into other blocks, each layer waited for on the
    # current stream before it is read.
    raw.zero_()
    torch.cuda.synchronize()
    md = KvbmConnectorMetadata(loads=[BlockLoad("B", keys, dst)])
    kw.bind()
    kw.start_load_kv(md)
    diffs = []
    for i, n in enumerate(names):
        kw.wait_for_layer_load(n)
        diffs.append((raw[i, dst] - want[i]).abs().sum())
    kw.wait_for_save(md)
    errors = kw.get_block_ids_with_load_errors()
    bad = [i for i, d in enumerate(diffs) if d.item() != 0]
    print(f"onboard: {LAYERS} layers x {len(dst)} blocks, mismatched layers {bad}, "
          f"failed blocks {sorted(errors)}", flush=True)
    assert not bad and not errors
    assert not raw[:, src].any(), "blocks outside the load were written"

    # 3. Sleep mode: G1's memory goes back to the driver and comes back.
    kw.unregister_kv_caches()
    del views
    raw = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    md = KvbmConnectorMetadata(loads=[BlockLoad("C", keys, dst)])
    kw.bind()
    kw.start_load_kv(md)
    kw.wait_for_save(md)
    refused = kw.get_block_ids_with_load_errors()
    assert refused == set(dst), f"a load while G1 is unregistered: failed {sorted(refused)}"
    raw = torch.zeros(LAYERS, NUM_BLOCKS, BLOCK, HEADS, 2 * HEAD, dtype=torch.float16, device=dev)
    views = {n: raw[i].permute(0, 2, 1, 3) for i, n in enumerate(names)}
    cfg, buffers, _ = g1_layout(views)  # as register_kv_caches makes them
    assert cfg == kw._g1[0]
    kw._g1 = (cfg, buffers)
    kw.restore_kv_caches()
    md = KvbmConnectorMetadata(loads=[BlockLoad("D", keys, dst)])
    kw.bind()
    kw.start_load_kv(md)
    for n in names:
        kw.wait_for_layer_load(n)
    kw.wait_for_save(md)
    errors = kw.get_block_ids_with_load_errors()
    torch.cuda.synchronize()
    bad = [i for i in range(LAYERS) if (raw[i, dst] - want[i]).abs().sum().item() != 0]
    print(f"sleep: load refused while unregistered ({len(refused)} blocks failed), after "
          f"restore mismatched layers {bad}, failed blocks {sorted(errors)}", flush=True)
    assert not bad and not errors
    print("vllm connector worker side on CUDA: OK", flush=True)
except Exception as e:  # noqa: BLE001 - report, then fail the step
    print(f"FAIL: {type(e).__name__}: {e}", flush=True)
    status = 1
finally:
    kw.shutdown()
sys.exit(status)
