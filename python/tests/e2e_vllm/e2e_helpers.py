"""Helpers of the real-engine tests (conftest.py has the fixtures): the tiny
model, prompts, and Engine, one engine.py process driven over a pipe."""
import json
import os
import random
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(os.path.dirname(HERE))

BLOCK = 32                 # tokens per block (CPU attention: a multiple of 32)
LAYERS, KV_HEADS, HEAD = 2, 2, 32
BLOCK_BYTES = LAYERS * 2 * BLOCK * KV_HEADS * HEAD * 4   # float32, K and V
G1_BLOCKS = 24             # small: four long requests at once are preempted


def make_model(path: str) -> None:
    """A Llama of random weights (fixed seed) and a word-level tokenizer,
    saved as a Hugging Face model directory. Head size 32 (CPU attention
    takes no smaller)."""
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=KV_HEADS * 2 * HEAD, intermediate_size=256,
                      num_attention_heads=4, num_key_value_heads=KV_HEADS,
                      num_hidden_layers=LAYERS, vocab_size=1000, max_position_embeddings=1024,
                      rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():  # larger weights than the default init: far-apart logits
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.save_pretrained(path)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, 1000)})
    tok = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>", unk_token="<pad>").save_pretrained(path)


def prompt(seed: int, n: int = 300):
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
