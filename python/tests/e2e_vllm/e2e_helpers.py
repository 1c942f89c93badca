"""Helpers of the real-engine tests (conftest.py has the fixtures): Engine,
one engine.py process driven over a pipe; the tiny model and prompts come
from e2e_common."""
import os

from e2e_common.engine_process import EngineProcess
from e2e_common.model import HEAD, KV_HEADS, LAYERS, free_port, make_model, prompt  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(os.path.dirname(HERE))

BLOCK = 32                 # tokens per block (CPU attention: a multiple of 32)
BLOCK_BYTES = LAYERS * 2 * BLOCK * KV_HEADS * HEAD * 4   # float32, K and V
G1_BLOCKS = 24             # small: four long requests at once are preempted


class Engine(EngineProcess):
    """engine.py in its own process."""

    def __init__(self, model: str, connector=None, role: str = "kv_both",
                 kv_bytes: int = G1_BLOCKS * BLOCK_BYTES, name: str = "engine",
                 tp: int = 1) -> None:
        cfg = {"model": model, "kv_bytes": kv_bytes, "connector": connector, "role": role,
               "tp": tp}
        env = dict(os.environ)
        env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
        if tp > 1:
            # A rank per core, in turn ("0|1" at TP 2 on two cores); vLLM's
            # automatic binding wants a NUMA node per rank.
            n = os.cpu_count() or 1
            env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(r % n) for r in range(tp))
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        super().__init__(os.path.join(HERE, "engine.py"), cfg, env, name, f"kvbm-e2e-{name}")

    def generate(self, prompts, max_tokens: int, kv_transfer_params=None) -> dict:
        return self.call("generate", prompts=prompts, max_tokens=max_tokens,
                         kv_transfer_params=kv_transfer_params)


def flat_ids(ids):
    """kv_transfer_params remote_block_ids, one list (vLLM may group them)."""
    return [b for g in ids for b in g] if ids and isinstance(ids[0], list) else list(ids)


def records(ans, ev):
    return [r for r in ans["records"] if r["ev"] == ev]


def require_bytes_checked(ans, blocks: int, is_async: bool = False, tp: int = 1):
    """Every load of this answer brought, into each G1 block, the bytes
    stored under its key; blocks in all on each of the tp ranks."""
    loaded = records(ans, "loaded")
    assert loaded, f"no load was checked: {ans['records']}"
    for r in loaded:
        assert r["bad"] == 0 and r["unknown"] == 0 and r["failed"] == 0, r
        assert r["async"] == is_async, r
    per_rank = {}
    for r in loaded:
        per_rank[r["rank"]] = per_rank.get(r["rank"], 0) + r["blocks"]
    assert per_rank == {rank: blocks for rank in range(tp)}, loaded
