"""P/D through two real `vllm serve` servers (vLLM's OpenAI API server), the
client passing kv_transfer_params from the prefill's answer to the decode as
vLLM's proxy does: a kv_producer on one core, a kv_consumer on the other.

Under load (a busy loop per core besides the servers), every decode request
ends, its pull done or failed, within the decode's pd_timeout_s (plus the
decode's own compute, measured alongside): nothing it waits for outlives
the deadline."""
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from e2e_helpers import BLOCK_BYTES, G1_BLOCKS, PYTHON_DIR, free_port, prompt

PD_TIMEOUT_S = 6.0
MAX_TOKENS = 8


class Server:
    """One vLLM OpenAI API server process, its engine bound to core."""

    def __init__(self, model: str, role: str, core: int, extra: dict, name: str) -> None:
        self.port = free_port()
        kt = {"kv_connector": "KvbmConnector", "kv_connector_module_path": "kvbmgo.vllm",
              "kv_role": role, "kv_connector_extra_config": extra}
        env = dict(os.environ)
        env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
        env.update(VLLM_CPU_OMP_THREADS_BIND=str(core % (os.cpu_count() or 1)),
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        self.name = name
        self.log = open(os.path.join(os.environ.get("KVBM_E2E_LOGDIR", "/tmp"),
                                     f"kvbm-e2e-{name}-{os.getpid()}.log"), "w")
        self.p = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
             "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(self.port),
             "--dtype", "float32", "--enforce-eager", "--block-size", "32",
             "--kv-cache-memory-bytes", str(G1_BLOCKS * BLOCK_BYTES), "--max-model-len", "512",
             "--max-num-seqs", "8", "--seed", "0", "--enable-prefix-caching",
             "--kv-transfer-config", json.dumps(kt)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 900) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.p.poll() is not None:
                raise RuntimeError(f"server {self.name} exited ({self.p.returncode}); its log "
                                   f"is {self.log.name}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5)
                return
            except (OSError, urllib.error.URLError):
                time.sleep(1)
        raise RuntimeError(f"server {self.name} not ready within {timeout} s")

    def complete(self, tokens, max_tokens: int, kv_transfer_params=None, timeout=300):
        """(HTTP status, the answer's JSON, seconds it took)."""
        body = {"model": "m", "prompt": tokens, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = kv_transfer_params
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read()), time.monotonic() - t0
        except urllib.error.HTTPError as e:
            return e.code, {"error": e.read().decode("utf-8", "replace")}, time.monotonic() - t0

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


@pytest.fixture(scope="module")
def servers(model_dir):
    p = Server(model_dir, "kv_producer", 0, {"g2_blocks": 32, "pd_port": free_port(),
                                             "pd_hold_s": 60.0}, "serve-prefill")
    d = Server(model_dir, "kv_consumer", 1, {"g2_blocks": 32, "pd_port": free_port(),
                                             "pd_timeout_s": PD_TIMEOUT_S}, "serve-decode")
    try:
        p.wait_ready()
        d.wait_ready()
    except BaseException:
        d.close()
        p.close()
        raise
    yield p, d
    d.close()
    p.close()


def _tokens(answer):
    return list(answer["choices"][0]["token_ids"])


def hand_over(p, d, tokens):
    """The prefill's answer, then the decode's: (decode status, its answer,
    its seconds)."""
    status, out, _ = p.complete(tokens, 1, {"do_remote_decode": True})
    assert status == 200, out
    params = out.get("kv_transfer_params")
    assert params and params.get("do_remote_prefill"), out
    return d.complete(tokens, MAX_TOKENS, params, timeout=120)


def test_serve_prefill_decode_hand_over(servers, baseline):
    p, d = servers
    ps = prompt(50)
    status, out, _ = hand_over(p, d, ps)
    assert status == 200, out
    assert _tokens(out) == baseline([ps], MAX_TOKENS)[0]


def test_serve_pd_under_load_ends_within_the_deadline(servers, baseline):
    """A busy loop per core: each decode request ends, its tokens right or
    its pull failed (HTTP 500), within pd_timeout_s plus the decode's
    compute (a request of the same length without P/D, measured under the
    same load), never later; one the prefill never holds fails at the
    deadline."""
    p, d = servers
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]
    try:
        status, _, compute_s = d.complete(prompt(59), MAX_TOKENS)
        assert status == 200
        results = []
        for seed in (51, 52, 53):
            ps = prompt(seed)
            status, out, took = hand_over(p, d, ps)
            results.append((status, round(took, 1)))
            assert status in (200, 500), out
            if status == 200:
                assert _tokens(out) == baseline([ps], MAX_TOKENS)[0]
            assert took <= PD_TIMEOUT_S + 2 * compute_s + 2.0, (results, compute_s)
        # A request the prefill never holds (its id forged; the token is
        # another's): asked until the deadline, then failed, not later.
        ps = prompt(54)
        status, out, _ = p.complete(ps, 1, {"do_remote_decode": True})
        assert status == 200, out
        forged = dict(out["kv_transfer_params"], remote_request_id="not-held")
        status, out, took = d.complete(ps, MAX_TOKENS, forged, timeout=120)
        results.append((status, round(took, 1)))
        assert status == 500, out
        assert PD_TIMEOUT_S - 0.5 <= took <= PD_TIMEOUT_S + 2 * compute_s + 2.0, \
            (results, compute_s)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    print(f"P/D under load: (status, seconds) {results}; a request without P/D took "
          f"{compute_s:.1f} s; pd_timeout_s {PD_TIMEOUT_S}")
