"""Helpers of the real-engine tests (conftest.py has the fixtures): Engine,
one engine.py process driven over a pipe; the tiny model and prompts come
from e2e_common."""
import json
import os
import subprocess
import sys
import tempfile

from e2e_common.model import HEAD, KV_HEADS, LAYERS, free_port, make_model, prompt  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(os.path.dirname(HERE))

BLOCK = 32                 # tokens per block (CPU attention: a multiple of 32)
BLOCK_BYTES = LAYERS * 2 * BLOCK * KV_HEADS * HEAD * 4   # float32, K and V
G1_BLOCKS = 24             # small: four long requests at once are preempted


class Engine:
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
        self.name = name
        self.log = open(os.path.join(os.environ.get("KVBM_E2E_LOGDIR", tempfile.gettempdir()),
                                     f"kvbm-e2e-{name}-{os.getpid()}.log"), "w")
        self.p = subprocess.Popen([sys.executable, os.path.join(HERE, "engine.py"),
                                   json.dumps(cfg)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self._read()  # ready

    def _read(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            self.log.flush()
            with open(self.log.name) as f:
                tail = f.read()[-4000:]
            raise RuntimeError(f"engine {self.name} exited ({self.p.poll()}); its log:\n{tail}")
        return json.loads(line)

    def call(self, op: str, **kw) -> dict:
        self.p.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.p.stdin.flush()
        return self._read()

    def generate(self, prompts, max_tokens: int, kv_transfer_params=None) -> dict:
        return self.call("generate", prompts=prompts, max_tokens=max_tokens,
                         kv_transfer_params=kv_transfer_params)

    @property
    def pid(self) -> int:
        return self.p.pid

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self.call("quit")
                self.p.wait(60)
            except Exception:  # noqa: BLE001
                self.p.kill()
                self.p.wait()
        self.log.close()


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
