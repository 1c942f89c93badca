"""The prefill of the two-process heterogeneous-TP test, at the worker
level: python tp_prefill_process.py PORT TP KV_HEADS. TP KvbmWorkers (the
connector's worker side, ranks 0..TP-1 of engine "prefill-proc") register
vLLM KV views of their heads of a model with KV_HEADS KV heads, write 3
blocks of a global KV pattern (rank r its heads) and hold request "R" for a
decode. Prints one JSON line: the blocks, the token, and each block's global
KV (hex, every layer); then a line each time a rank reports R in
finished_sending (its decode ranks were done), until every rank did or a
minute passed."""
import json
import sys
import time

from tp_engine import global_kv, kv_views, rank_heads

import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec

from harness import BLOCK, HEAD, LAYERS
from kvbmgo.vllm.config import KvbmConfig
from kvbmgo.vllm.metadata import KvbmConnectorMetadata, RemoteSend
from kvbmgo.vllm.worker import KvbmWorker

IDS = [5, 2, 9]
TOKEN = "0123456789abcdef0123456789abcdef"


def main() -> None:
    port, tp, total = (int(a) for a in sys.argv[1:4])
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=max(1, total // tp), head_size=HEAD,
                             dtype=torch.float16)
    config = KvbmConfig(g2_blocks=8, pd_port=port)
    workers, views = [], []
    for r in range(tp):
        v, _, _ = kv_views(spec, "LBNHC", 16)
        w = KvbmWorker(config, rank=r, role="kv_producer", engine_id="prefill-proc",
                       tp_size=tp, kv_heads=total)
        w.register_kv_caches(v)
        workers.append(w)
        views.append(v)
    try:
        blocks = []
        for i, b in enumerate(IDS):
            per_layer = []
            for layer in range(len(LAYERS)):
                g = global_kv(1000 + i, layer, total, 2 * HEAD)
                for r in range(tp):
                    views[r][LAYERS[layer]][b].view(torch.int16).copy_(g[rank_heads(r, tp, total,
                                                                                    False)])
                per_layer.append(g.numpy().tobytes().hex())
            blocks.append(per_layer)
        md = KvbmConnectorMetadata(sends=[RemoteSend("R", list(IDS), TOKEN)])
        for w in workers:
            w.bind()
            w.start_load_kv(md)
        print(json.dumps({"block_ids": IDS, "token": TOKEN, "blocks": blocks}), flush=True)
        left = set(range(tp))
        deadline = time.monotonic() + 60
        while left and time.monotonic() < deadline:
            for r in sorted(left):
                w = workers[r]
                w.bind()
                w.start_load_kv(KvbmConnectorMetadata())
                sending, _ = w.get_finished()
                if sending:
                    print(json.dumps({"rank": r, "finished_sending": sorted(sending)}),
                          flush=True)
                    left.discard(r)
            time.sleep(0.005)
    finally:
        for w in workers:
            w.shutdown()


if __name__ == "__main__":
    main()
