"""One real SGLang engine (sglang.Engine on CPU) driven over stdin/stdout:
python engine.py CONFIG_JSON. CONFIG: {"model": dir, "hicache": extra
config of the kvbm storage backend or null (no HiCache), "pd": null,
"prefill" or "decode", "bootstrap_port": n (PD), "engine": more of
sglang.Engine's arguments or null (a hybrid model's: MAMBA_ENGINE of
sglang_helpers.py)}. SGLang logs at warning, or at $KVBM_E2E_SGLANG_LOG.
SGLang's scheduler runs in a process of its own (it imports this file
again, without running main); the recording storage there writes its
records into $KVBM_E2E_RECORDS (recording_storage.py).

Reads one JSON command a line, answers one JSON line (on the original
stdout; SGLang's own output goes to stderr):
  {"op": "generate", "prompts": [[ids]], "max_tokens": n,
   "bootstrap": {"host": h, "port": p, "rooms": [n]} (PD, optional)}
      -> {"tokens": [[ids]], "cached": [meta_info["cached_tokens_details"]]}
  {"op": "flush"}     SGLang's flush_cache(): the device and host caches
                      emptied (what is in storage stays) -> {"flushed": bool}
  {"op": "quit"}"""
import json
import os
import sys

# SGLang's CPU engine (sglang.srt.platforms); set before SGLang is imported,
# here and so in the scheduler's process.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

if os.environ.get("KVBM_E2E_RECORDS"):
    # the PD byte check (recording_pd.py), in SGLang's scheduler process too
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import recording_pd
    recording_pd.install()

PAGE = 32                  # tokens per page (SGLang's page_size)
KV_TOKENS = 2048           # SGLang's device KV pool, in tokens


def engine_args(cfg: dict) -> dict:
    kw = dict(model_path=cfg["model"], device="cpu", attention_backend="torch_native",
              dtype="float32", page_size=PAGE, max_total_tokens=KV_TOKENS, context_length=1024,
              # the pool is sized by max_total_tokens; a large fraction only
              # keeps SGLang's free-memory check quiet on a busy machine
              mem_fraction_static=0.8, random_seed=0, disable_cuda_graph=True,
              skip_server_warmup=True, log_level=os.environ.get("KVBM_E2E_SGLANG_LOG", "warning"), host="127.0.0.1")
    if cfg.get("hicache") is not None:
        extra = {"backend_name": "kvbm", "module_path": "recording_storage",
                 "class_name": "RecordingKvbmHiCacheStorage", "interface_v1": 1}
        extra.update(cfg["hicache"])
        kw.update(enable_hierarchical_cache=True, hicache_ratio=2,
                  # CPU: torch copies (standins/cpu_hicache_host_pool.py)
                  hicache_io_backend="direct", hicache_mem_layout="page_first_direct",
                  # every page to storage as soon as it is in the host pool,
                  # and a request waits for its prefetch from storage
                  hicache_write_policy="write_through",
                  hicache_storage_prefetch_policy="wait_complete",
                  hicache_storage_backend="dynamic",
                  hicache_storage_backend_extra_config=json.dumps(extra))
    if cfg.get("pd"):
        kw.update(disaggregation_mode=cfg["pd"], disaggregation_transfer_backend="kvbm",
                  disaggregation_bootstrap_port=int(cfg["bootstrap_port"]))
        if cfg["pd"] == "prefill":
            # the overlap scheduler makes a torch.cuda.Event for a request
            # whose prefix is cached
            kw["disable_overlap_schedule"] = True
    kw.update(cfg.get("engine") or {})
    return kw


def main() -> None:
    cfg = json.loads(sys.argv[1])
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    import sglang

    engine = sglang.Engine(**engine_args(cfg))
    reply.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        ans: dict = {}
        if op == "generate":
            sp = {"temperature": 0.0, "max_new_tokens": int(cmd["max_tokens"]),
                  "ignore_eos": True}
            kw = {}
            if cmd.get("bootstrap"):
                b = cmd["bootstrap"]
                kw = dict(bootstrap_host=[b["host"]] * len(cmd["prompts"]),
                          bootstrap_port=[int(b["port"])] * len(cmd["prompts"]),
                          bootstrap_room=[int(r) for r in b["rooms"]])
            outs = engine.generate(input_ids=cmd["prompts"], sampling_params=sp, **kw)
            ans["tokens"] = [list(o["output_ids"]) for o in outs]
            ans["cached"] = [o["meta_info"].get("cached_tokens_details") for o in outs]
        elif op == "flush":
            ans["flushed"] = bool(engine.flush_cache().success)
        elif op == "quit":
            reply.write(json.dumps({"bye": True}) + "\n")
            break
        reply.write(json.dumps(ans, default=str) + "\n")
    engine.shutdown()


if __name__ == "__main__":
    main()
