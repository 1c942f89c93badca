import numpy as np, kvbmgo
caches = {f"layer.{i}": np.zeros((2, 16, 16, 8, 64), np.float16) for i in range(4)}  # [2, blocks, page, heads, head_size]
with kvbmgo.Worker(worker_id=1) as w:
    cfg, _ = w.register_kv_caches(caches)                       # G1: the engine's KV cache (emulated device)
    w.allocate_g2(cfg.replace(layout="fully_contiguous"))        # G2: pinned host memory owned by kvbm
    caches["layer.0"][:, 3] = 1.5
    with w.transfer(kvbmgo.Tier.G1, [3], kvbmgo.Tier.G2, [0]) as n: n.wait()   # offload block 3
    caches["layer.0"][:] = 0
    with w.transfer(kvbmgo.Tier.G2, [0], kvbmgo.Tier.G1, [7]) as n: n.wait()   # onboard it into block 7
    print("block 7 restored:", bool((caches["layer.0"][:, 7] == 1.5).all()))
