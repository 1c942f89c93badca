"""Helpers of the real-engine tests (conftest.py has the fixtures): Engine,
one engine.py process driven over a pipe; the tiny models and prompts come
from e2e_common. swa_engine and require_groups_loaded are the hybrid
(sliding-window) model's, for its scenarios on one engine or two (P/D)."""
import os

from e2e_common.engine_process import EngineProcess
from e2e_common.hybrid_model import MAMBA_ENGINE_ARGS, WINDOW, make_mamba_model, \
    make_swa_model  # noqa: F401
from e2e_common.model import HEAD, KV_HEADS, LAYERS, free_port, make_model, prompt  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(os.path.dirname(HERE))

BLOCK = 32                 # tokens per block (CPU attention: a multiple of 32)
BLOCK_BYTES = LAYERS * 2 * BLOCK * KV_HEADS * HEAD * 4   # float32, K and V
G1_BLOCKS = 24             # small: four long requests at once are preempted
# The sliding-window model: a block of each group is a page of its one layer
# (the groups share G1's pages). vLLM wants 34 of them at least for a
# max_model_len of 512 (its check adds up each group's most: a request's 16
# full-attention blocks, and the window's with a batch of tokens); four long
# requests at once are preempted.
SWA_PAGE_BYTES = 2 * BLOCK * KV_HEADS * HEAD * 4
SWA_G1_BLOCKS = 34
# The Mamba model: vLLM grows the attention block to 64 tokens, whose page
# (32 KiB) holds the Mamba state too (hybrid_model.make_mamba_model).
MAMBA_PAGE_BYTES = 2 * 64 * KV_HEADS * HEAD * 4


class Engine(EngineProcess):
    """engine.py in its own process."""

    def __init__(self, model: str, connector=None, role: str = "kv_both",
                 kv_bytes: int = G1_BLOCKS * BLOCK_BYTES, name: str = "engine",
                 tp: int = 1, engine_args=None) -> None:
        cfg = {"model": model, "kv_bytes": kv_bytes, "connector": connector, "role": role,
               "tp": tp, "engine_args": engine_args}
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


def swa_engine(model_dir: str, connector=None, name: str = "swa", role: str = "kv_both",
               g1_blocks: int = SWA_G1_BLOCKS) -> Engine:
    """An engine of the sliding-window model (e2e_common/hybrid_model.py),
    with a G1 of g1_blocks pages."""
    return Engine(model_dir, connector, role=role, kv_bytes=g1_blocks * SWA_PAGE_BYTES,
                  name=name)


def mamba_engine(model_dir: str, connector=None, name: str = "mamba", role: str = "kv_both",
                 g1_blocks: int = 64) -> Engine:
    """An engine of the Mamba model (e2e_common/hybrid_model.py), with a G1
    of g1_blocks pages, in vLLM's "align" mode (prefix caching on)."""
    return Engine(model_dir, connector, role=role, kv_bytes=g1_blocks * MAMBA_PAGE_BYTES,
                  name=name, engine_args=MAMBA_ENGINE_ARGS)


def require_groups_loaded(ans, per_group: dict):
    """Hybrid: the loads of this answer (async, as every load with several
    groups) brought per_group[g] blocks of group g, each holding the bytes
    stored under its key, into the ids vLLM's table gives that group and
    block: never the null block, a sliding window's blocks exactly
    those in the window, a Mamba group's one state in the entry of the
    hit's last block (recording.load_map)."""
    maps = records(ans, "load_map")
    assert maps, f"no load was mapped: {ans['records']}"
    for m in maps:
        assert m["null"] == m["wrong"] == m["out_of_window"] == m["window_missing"] == 0, m
        assert m["state_wrong"] == 0, m
    loaded = records(ans, "loaded")
    assert loaded, f"no load was checked: {ans['records']}"
    got = {}
    for r in loaded:
        assert r["bad"] == 0 and r["unknown"] == 0 and r["failed"] == 0, r
        assert r["async"], r
        for g, (n, _) in r["groups"].items():
            got[int(g)] = got.get(int(g), 0) + n
    assert got == per_group, loaded


def bad_per_group(ans) -> dict:
    """{group: blocks loaded with wrong bytes} over this answer's loads."""
    out = {}
    for r in records(ans, "loaded"):
        for g, (_, bad) in r["groups"].items():
            out[int(g)] = out.get(int(g), 0) + bad
    return out
