"""Helpers of the SGLang real-engine tests (conftest.py has the fixtures):
Engine, one engine.py process driven over a pipe, and the byte check over
the recording storage's records (recording_storage.py)."""
import contextlib
import glob
import json
import os
import time

from e2e_common.engine_process import EngineProcess
from e2e_common.model import free_port, prompt

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(os.path.dirname(HERE))
#: The CPU stand-ins (sgl_kernel, the HiCache host pool), for this suite's
#: engines only.
STANDINS = os.path.join(HERE, "standins")

PAGE = 32                  # tokens per page (engine.py)
#: SGLang's engine arguments for a Mamba-kind hybrid on CPU. Its Mamba
#: prefix cache there has one strategy, no_buffer (extra_buffer needs
#: CUDA, NPU, HIP or XPU: mamba_hook._platform_supports_mamba_cache_extra_buffer),
#: which needs pages of one token and no overlap scheduler; the state pools
#: (device and host) are sized for a few requests, not SGLang's default
#: thousand (16.7 GB of host pool).
MAMBA_ENGINE = {"page_size": 1, "disable_overlap_schedule": True, "max_mamba_cache_size": 32,
                "max_running_requests": 8}
PROMPT_TOKENS = 300        # the HiCache tests' prompts
HIT = PROMPT_TOKENS // PAGE * PAGE   # 288: SGLang keeps whole pages only
PAGES = HIT // PAGE


class Engine(EngineProcess):
    """engine.py in its own process; records (the recording storage's) go
    into records_dir."""

    def __init__(self, model: str, records_dir: str, name: str, hicache=None, pd=None,
                 bootstrap_port=None, engine=None) -> None:
        cfg = {"model": model, "hicache": hicache, "pd": pd, "bootstrap_port": bootstrap_port,
               "engine": engine}
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [STANDINS, HERE, PYTHON_DIR] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["KVBM_E2E_RECORDS"] = records_dir
        if pd:
            # One host: the PD control sockets on loopback, where the
            # same-host key is enough (SGLang's default is the host's
            # address, which without KVBM_AUTH_KEY refuses to start).
            env.setdefault("SGLANG_HOST_IP", "127.0.0.1")
        # loads while the test makes its other engines: its first call waits
        super().__init__(os.path.join(HERE, "engine.py"), cfg, env, name,
                         f"kvbm-e2e-sglang-{name}", log_tail=6000, new_session=True,
                         wait=False)

    def generate(self, prompts, max_tokens: int) -> dict:
        return self.call("generate", prompts=prompts, max_tokens=max_tokens)

    def exited(self) -> None:
        # SGLang's scheduler and detokenizer, should the engine have left them
        try:
            os.killpg(self.p.pid, 9)
        except ProcessLookupError:
            pass


class Records:
    """The recording storage's records in a directory (every process's),
    read as they grow."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen = {}
        self.stored = {}   # SGLang key -> digests stored under it, every process

    def take(self) -> list:
        """The records written since the last take."""
        out = []
        for f in sorted(glob.glob(os.path.join(self.path, "records-*.jsonl"))):
            with open(f) as fh:
                fh.seek(self._seen.get(f, 0))
                data = fh.read()
            end = data.rfind("\n") + 1   # a line being written waits for the next take
            self._seen[f] = self._seen.get(f, 0) + end
            for line in data[:end].splitlines():
                r = json.loads(line)
                if r["ev"] == "stored":
                    self.stored.setdefault(r["key"], set()).add(r["digest"])
                out.append(r)
        return out

    def wait_stored(self, pages: int, timeout: float = 120) -> list:
        """Waits until pages more keys were stored (SGLang backs up to
        storage in a thread of its own) and returns the records."""
        before = set(self.stored)
        got, deadline = [], time.monotonic() + timeout
        while True:
            got += self.take()
            if len(set(self.stored) - before) >= pages:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"{pages} pages were not stored within {timeout} s: {got}")
            time.sleep(0.2)


def wait_objects(object_dir: str, n: int, timeout: float = 120) -> None:
    """Waits until the G4 directory holds n objects (kvbm writes them in the
    background; one file per page, written under a temporary name first)."""
    deadline = time.monotonic() + timeout
    while True:
        have = sum(1 for _, _, fs in os.walk(object_dir) for f in fs if not f.startswith(".tmp-"))
        if have >= n:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{object_dir} holds {have} objects after {timeout} s, "
                                 f"want {n}")
        time.sleep(0.2)


def storage(object_dir: str) -> dict:
    """The kvbm HiCache storage of the tests: G4 written as soon as a page
    is in kvbm's G2, so a fresh process finds it."""
    return {"g2_pages": 64, "object_dir": object_dir, "g4_mode": "write_through"}


def served(engine: Engine, records: Records, expect, seed: int, stored: int):
    """The prompt of seed, served (tokens as expected) and stored (stored
    keys more, every pool's); the engine's caches flushed."""
    p = prompt(seed, PROMPT_TOKENS)
    want = expect([p], 8)
    assert engine.generate([p], 8)["tokens"] == want
    records.wait_stored(stored)
    flush(engine)
    return p, want


def flush(engine: Engine, timeout: float = 60) -> None:
    """SGLang's flush_cache(), again while it refuses (it does while a
    backup to storage is still in flight)."""
    deadline = time.monotonic() + timeout
    while not engine.call("flush")["flushed"]:
        assert time.monotonic() < deadline, f"flush_cache() refused for {timeout} s"
        time.sleep(0.5)


def from_storage(ans: dict) -> int:
    """Tokens SGLang says came from storage (one prompt)."""
    details = ans["cached"][0] or {}
    return details.get("storage", 0)


def require_bytes_checked(records: Records, taken: list, pages) -> None:
    """Every page kvbm loaded in taken holds bytes stored under its key
    (by any process); pages in all: a count of KV pages, or per pool
    ({"kv": 9, "swa": 2}: every pool of a hybrid model)."""
    want = pages if isinstance(pages, dict) else {"kv": pages}
    loaded = [r for r in taken if r["ev"] == "loaded"]
    got = {}
    for r in loaded:
        got[r.get("pool", "kv")] = got.get(r.get("pool", "kv"), 0) + 1
    assert got == want, f"pages loaded per pool {got}, want {want}: {taken}"
    bad = [r["key"] for r in loaded if r["digest"] not in records.stored.get(r["key"], ())]
    assert not bad, f"{len(bad)} of {len(loaded)} loaded pages hold bytes not stored " \
                    f"under their key: {bad}"


@contextlib.contextmanager
def pd_pair(model: str, records: Records, name: str, engine=None):
    """A prefill engine and a decode engine of model with kvbm's PD backend
    (records: recording_pd.py's); yields (prefill, decode, bootstrap port)."""
    port = free_port()
    p = Engine(model, records.path, f"{name}prefill", pd="prefill", bootstrap_port=port,
               engine=engine)
    try:
        d = Engine(model, records.path, f"{name}decode", pd="decode", bootstrap_port=port,
                   engine=engine)
    except BaseException:
        p.close()
        raise
    try:
        # loaded side by side; both ready before the prefill gets a request
        p.wait_ready()
        d.wait_ready()
        yield p, d, port
    finally:
        d.close()
        p.close()


def hand_over(prefill: Engine, decode: Engine, port: int, prompts: list, rooms: list) -> list:
    """The prompts through prefill then decode (both get them with the same
    bootstrap rooms, as sglang-router sends them); the decode's tokens."""
    boot = {"host": "127.0.0.1", "port": port, "rooms": rooms}
    prefill.send("generate", prompts=prompts, max_tokens=8, bootstrap=boot)
    decode.send("generate", prompts=prompts, max_tokens=8, bootstrap=boot)
    got, _ = decode.read(), prefill.read()
    return got["tokens"]


def require_handed_over(model: str, records: Records, name: str, prompts: list, rooms: list,
                        expect, engine=None) -> None:
    """A hybrid model's PD pair (pd_pair) hands prompts over: the decode's
    tokens are expect's, its KV pages and every state the bytes the prefill
    sent (require_pd_bytes)."""
    with pd_pair(model, records, name, engine) as (prefill, decode, port):
        assert hand_over(prefill, decode, port, prompts, rooms) == expect(prompts, 8)
    page = (engine or {}).get("page_size", PAGE)
    require_pd_bytes(records.take(), rooms, prompts, page, states=True)


def require_pd_bytes(taken: list, rooms: list, prompts: list, page: int,
                     states: bool = False) -> None:
    """Per room: the decode received the KV pages the prefill sent, byte
    for byte (its whole pages: the decode writes its own tokens into the
    last), and with states, every state slot of every component
    (recording_pd.py's records)."""
    for room, p in zip(rooms, prompts):
        full = len(p) // page
        mine = [r for r in taken if r["room"] == room]
        sent = [d for r in mine if r["ev"] == "pd-sent" for d in r["digests"]]
        received = [r["digests"] for r in mine if r["ev"] == "pd-received"]
        assert len(received) == 1, mine
        assert len(sent) >= full and len(received[0]) >= full, (sent, received)
        assert received[0][:full] == sent[:full]
        if states:
            s_sent = [r["states"] for r in mine if r["ev"] == "pd-state-sent"]
            s_received = [r["states"] for r in mine if r["ev"] == "pd-state-received"]
            assert len(s_sent) == 1 and s_sent[0] and all(s_sent[0]), mine
            assert s_received == s_sent, mine
