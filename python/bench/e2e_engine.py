"""One vLLM CPU engine for bench_e2e.py, driven over stdin/stdout (one JSON
line a message each way): python e2e_engine.py CONFIG_JSON, CONFIG:
{"model": dir, "kv_bytes": G1 bytes, "max_model_len": n, "connector":
kv_connector_extra_config or null}. The engine core runs in this process.

  {"op": "ttft", "prompt": [ids]}   -> {"s": seconds}: the request with
      max_tokens 1 (its prefill and first token), alone in the engine
  {"op": "reset"}                    vLLM's prefix cache reset (kvbm's
      tiers are kept)
  {"op": "settle"}                   waits until kvbm's cache moves nothing
      (nothing in flight, no G2 block pinned by a write-through)
  {"op": "stats"}                    kvbm's cache counters (rank 0)
  {"op": "quit"}"""
import json
import os
import sys
import time


def main() -> None:
    cfg = json.loads(sys.argv[1])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = dict(model=cfg["model"], dtype="float32", enforce_eager=True, block_size=32,
              kv_cache_memory_bytes=int(cfg["kv_bytes"]), max_model_len=int(cfg["max_model_len"]),
              max_num_batched_tokens=int(cfg["max_model_len"]), max_num_seqs=4, seed=0,
              enable_prefix_caching=True)
    if cfg.get("connector") is not None:
        kw["kv_transfer_config"] = {"kv_connector": "KvbmConnector",
                                    "kv_connector_module_path": "kvbmgo.vllm",
                                    "kv_role": "kv_both",
                                    "kv_connector_extra_config": cfg["connector"]}
    llm = LLM(**kw)
    sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    reply.write(json.dumps({"ready": True}) + "\n")

    def worker():
        from vllm.distributed.kv_transfer import get_kv_transfer_group
        return get_kv_transfer_group()._worker

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        ans: dict = {}
        if op == "ttft":
            t0 = time.perf_counter()
            llm.generate([TokensPrompt(prompt_token_ids=cmd["prompt"])], sp, use_tqdm=False)
            ans["s"] = time.perf_counter() - t0
        elif op == "reset":
            ans["reset"] = bool(llm.reset_prefix_cache())
        elif op == "settle":
            # Nothing in flight, and nothing pinned in G2: a write-through
            # to G4 pins its G2 blocks until the store has them (the S3
            # server, on this machine, hashes and writes what it receives:
            # CPU the next request's prefill would share).
            cache = worker().worker.cache
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                st = cache.stats()
                if st.g2.in_flight == 0 and st.g3.in_flight == 0 and st.g2.pinned == 0:
                    break
                time.sleep(0.01)
            # A step so that the scheduler side hears every event.
            llm.generate([TokensPrompt(prompt_token_ids=[5])], sp, use_tqdm=False)
        elif op == "stats":
            from dataclasses import asdict
            ans["stats"] = asdict(worker().worker.cache.stats())
        elif op == "quit":
            reply.write(json.dumps({"bye": True}) + "\n")
            break
        reply.write(json.dumps(ans) + "\n")


if __name__ == "__main__":
    main()
