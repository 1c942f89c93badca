"""P/D between tensor-parallel sizes (heterogeneous TP), with the real vLLM
scheduler (0.33 and 0.34) and one worker connector per rank (tp_engine.py): a decode at
TP d pulls from a prefill at TP p, its KV heads gathered from several
prefill ranks (p > d) or sliced out of one (p < d), as NixlConnector maps
them; MLA (replicated KV) at any sizes; a pair that cannot be mapped is
refused with both sizes named. Every byte of every pulled block is checked:
each decode rank's heads equal the slice of the global KV the prefill ranks
held."""
import logging
import socket

from harness import require_vllm

require_vllm()

import pytest  # noqa: E402
import torch  # noqa: E402

from harness import BLOCK, LAYERS  # noqa: E402
from kvbmgo.vllm.metadata import KvbmConnectorMetadata, RemotePull  # noqa: E402
from tp_engine import TpEngine, kv_views, model_dir, rank_heads, run_both  # noqa: E402

PROMPT = list(range(300, 300 + 3 * BLOCK + 5))   # 3 full blocks and 5 tokens


def free_port(n=1):
    """A port with n free ones from it (the side channels of n ranks)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65536:
            continue
        try:
            socks = []
            for i in range(1, n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", base + i))
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
        return base
    raise RuntimeError("no free port range")


def engines(model, p, d, *, p_layout="LBNHC", d_layout="LBNHC", timeout_s=10.0):
    pe = TpEngine(model, p, {"g2_blocks": 8, "pd_port": free_port(p)}, role="kv_producer",
                  engine_id="prefill-tp", layout=p_layout)
    de = TpEngine(model, d, {"g2_blocks": 8, "pd_timeout_s": timeout_s}, role="kv_consumer",
                  engine_id="decode-tp", layout=d_layout)
    return pe, de


def prefill(pe, req_id="R", prompt=PROMPT):
    pe.add(req_id, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    for _ in range(1000):
        if req_id in pe.finished:
            break
        pe.step()
    params = pe.finished[req_id].kv_transfer_params
    assert params is not None and params["tp_size"] == pe.tp
    want = [[pe.assembled(b, layer) for layer in range(len(LAYERS))]
            for b in params["remote_block_ids"]]
    return params, want


def hand_over(pe, de, params, want):
    """Runs the decode of PROMPT with the prefill's params; checks, before
    the decode's first forward, every byte of every decode rank's pulled
    blocks and that no other block was written."""
    de.add("R-decode", PROMPT, max_tokens=2, kv_transfer_params=params)
    seen = {}

    def check(so):
        if "R-decode" not in so.num_scheduled_tokens or seen:
            return
        ids = de.block_ids("R-decode")
        seen["ids"] = ids
        n = len(want)
        for r in range(de.tp):
            heads = rank_heads(r, de.tp, de.total, de.mla)
            for i, b in enumerate(ids[:n]):
                for layer in range(len(LAYERS)):
                    got = de.read(r, b, layer)
                    assert torch.equal(got, want[i][layer][heads]), \
                        f"decode rank {r} block {i} (G1 {b}) layer {layer}: heads {heads}"
            for b in range(de.kvc.num_blocks):
                if b not in ids[:n]:
                    for layer in range(len(LAYERS)):
                        assert not de.read(r, b, layer).any(), f"rank {r} block {b} written"
    run_both(pe, de, before_forward=check)
    assert seen, "the decode request was never scheduled"
    assert de.finished["R-decode"].finish_reason.name == "LENGTH"
    assert not set().union(*(o.invalid_block_ids or () for o in de.outputs))
    assert [o.finished_recving for o in de.outputs if o.finished_recving] == [{"R-decode"}]
    # Every prefill rank let go, once every decode rank that reads it was done.
    assert [o.finished_sending for o in pe.outputs if o.finished_sending] == [{"R"}]
    assert not pe.sched.requests and not de.sched.requests


@pytest.mark.parametrize("kv_heads,p,d,p_layout,d_layout", [
    (2, 2, 1, "LBNHC", "LBNHC"),   # gather: 2 prefill ranks fill 1 decode rank
    (2, 2, 1, "LBHNC", "BLNHC"),   # ... other orders (HND into NHD)
    (2, 1, 2, "LBNHC", "LBNHC"),   # slice: 2 decode ranks read 1 prefill rank
    (4, 4, 2, "LBHNC", "LBNHC"),   # gather, 4 heads
    (2, 4, 2, "LBNHC", "LBNHC"),   # 2 heads over 4 prefill ranks: replicated
], ids=["p2-d1", "p2-d1-orders", "p1-d2", "p4-d2", "p4-d2-replicated"])
def test_heterogeneous_tp_byte_for_byte(tmp_path, kv_heads, p, d, p_layout, d_layout):
    pe, de = engines(model_dir(tmp_path, kv_heads), p, d, p_layout=p_layout,
                     d_layout=d_layout)
    try:
        params, want = prefill(pe)
        hand_over(pe, de, params, want)
    finally:
        de.close()
        pe.close()


@pytest.mark.parametrize("p,d", [(2, 1), (1, 2)], ids=["p2-d1", "p1-d2"])
def test_mla_any_rank_copy(tmp_path, p, d):
    """MLA's KV is the same on every rank: a decode rank reads one prefill
    rank's whole blocks, and every prefill rank is told done."""
    pe, de = engines(model_dir(tmp_path, mla=True), p, d)
    try:
        assert pe.mla and de.mla
        params, want = prefill(pe)
        hand_over(pe, de, params, want)
    finally:
        de.close()
        pe.close()


def test_a_pair_that_cannot_be_mapped_is_refused(tmp_path, caplog):
    """p=2, d=3: neither divides the other. The first request fails (policy
    fail) with an error naming both sizes and why; nothing is written; the
    prefill's ranks are told to let go."""
    pe, de = engines(model_dir(tmp_path, 6), 2, 3, timeout_s=3.0)
    try:
        params, _ = prefill(pe)
        de.add("R-decode", PROMPT, max_tokens=2, kv_transfer_params=params)
        with caplog.at_level(logging.ERROR, logger="kvbmgo.vllm.pd_decode"):
            run_both(pe, de)
        assert de.finished["R-decode"].finish_reason.name == "ERROR"
        msgs = [r.getMessage() for r in caplog.records if r.name == "kvbmgo.vllm.pd_decode"]
        assert any("tensor-parallel size 2, this decode 3" in m and "divides" in m
                   for m in msgs), msgs
        for r in range(de.tp):
            for b in range(de.kvc.num_blocks):
                assert not de.read(r, b, 0).any()
        assert [o.finished_sending for o in pe.outputs if o.finished_sending] == [{"R"}]
    finally:
        de.close()
        pe.close()


class PrefillProcess:
    """tp_prefill_process.py in a child process; its JSON lines read by a thread."""

    def __init__(self, port, tp, kv_heads):
        import json
        import os
        import queue
        import subprocess
        import sys
        import threading
        import kvbmgo
        from kvbmgo._lib import lib
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.dirname(os.path.dirname(os.path.abspath(kvbmgo.__file__)))
        env = dict(os.environ, KVBM_LIBRARY=os.path.abspath(lib.path),
                   PYTHONPATH=os.pathsep.join([here, root]))
        self.child = subprocess.Popen(
            [sys.executable, os.path.join(here, "tp_prefill_process.py"), str(port), str(tp),
             str(kv_heads)], stdout=subprocess.PIPE, text=True, env=env, cwd=here)
        self.lines = queue.Queue()

        def read():
            for line in self.child.stdout:
                self.lines.put(json.loads(line))
            self.lines.put(None)
        threading.Thread(target=read, daemon=True).start()

    def next(self, timeout=300):
        msg = self.lines.get(timeout=timeout)  # the first: once vLLM is imported (minutes, loaded)
        assert msg is not None, f"the prefill process ended with {self.child.wait()}"
        return msg

    def kill(self):
        if self.child.poll() is None:
            self.child.kill()
        self.child.wait()


def _pull_until_done(w, md, timeout=30.0):
    """Starts md's pulls on decode worker w; waits until its pull ended;
    returns the G1 blocks that failed."""
    import time
    w.bind()
    w.start_load_kv(md)
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "the pull did not end"
        w.bind()
        w.start_load_kv(KvbmConnectorMetadata())
        _, recving = w.get_finished()
        if recving:
            assert recving == {"D"}
            return w.get_block_ids_with_load_errors()
        time.sleep(0.005)


@pytest.mark.parametrize("p,d", [(2, 1), (1, 2)], ids=["p2-d1", "p1-d2"])
def test_two_processes_at_the_worker_level(p, d):
    """The prefill's p ranks in a child process (real sockets, the library's
    cross-process data plane), the decode's d ranks here, their KV views in
    another order (LBHNC here, LBNHC there). The decode ranks pull one after
    the other: with p=1, d=2 the prefill rank must keep its blocks after the
    first decode rank is done (two read it), or the second's pull fails.
    Every byte of every decode rank's blocks is checked."""
    import kvbmgo
    import numpy as np
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from harness import HEAD
    from kvbmgo.vllm.config import KvbmConfig
    from kvbmgo.vllm.worker import KvbmWorker
    if kvbmgo.info().transport == "loopback":
        pytest.skip("cross-process transport not available (issue 11)")
    total = 2
    port = free_port(p)
    proc = PrefillProcess(port, p, total)
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=max(1, total // d), head_size=HEAD,
                             dtype=torch.float16)
    workers, views = [], []
    try:
        for r in range(d):
            v, _, _ = kv_views(spec, "LBHNC", 16)
            w = KvbmWorker(KvbmConfig(g2_blocks=8, pd_timeout_s=20.0), rank=r,
                           role="kv_consumer", engine_id="decode-proc", tp_size=d,
                           kv_heads=total)
            w.register_kv_caches(v)
            workers.append(w)
            views.append(v)
        first = proc.next()
        local = [1, 7, 3]
        md = KvbmConnectorMetadata(pulls=[RemotePull(
            "D", "prefill-proc", "R", "127.0.0.1", port, p, first["block_ids"], local,
            first["token"])])
        for r, w in enumerate(workers):
            assert _pull_until_done(w, md) == set(), f"decode rank {r}'s pull failed"
        for r in range(d):
            heads = rank_heads(r, d, total, False)
            for i, b in enumerate(local):
                for layer in range(len(LAYERS)):
                    g = torch.from_numpy(np.frombuffer(bytes.fromhex(first["blocks"][i][layer]),
                                                       dtype=np.int16).copy())
                    g = g.view(total, BLOCK, 2 * HEAD)
                    got = views[r][LAYERS[layer]][b].view(torch.int16)
                    assert torch.equal(got, g[heads]), f"decode rank {r} block {i} layer {layer}"
            for b in range(16):
                if b not in local:
                    assert not views[r][LAYERS[0]][b].view(torch.int16).any()
        # Every prefill rank let go (after all its decode ranks were done).
        ranks = set()
        while len(ranks) < p:
            msg = proc.next(timeout=30)
            assert msg["finished_sending"] == ["R"]
            ranks.add(msg["rank"])
    finally:
        for w in workers:
            w.shutdown()
        proc.kill()


def test_a_prefill_rank_read_by_k_decode_ranks_lets_go_after_all_k():
    """The side channel alone: a done naming consumers=2 lets go only once
    two distinct decode ranks said done (a repeat counts once), also when
    one came before the hold; a done without the fields (an older decode)
    lets go at once; the pull's answer carries the rank's KV description."""
    import json
    import zmq
    import side_channel
    from kvbmgo.vllm.pd_prefill import PrefillServer
    port = free_port()
    kv = {"tp_size": 1, "tp_rank": 0, "heads": 2}
    srv = PrefillServer(b"metadata", "E", "127.0.0.1", port, 60.0, kv)
    ctx = zmq.Context()

    def ask(header):
        frames = side_channel.ask(ctx, port, dict(header, engine="E", token="T"), 5000,
                                  engine="E")
        assert frames is not None
        return json.loads(frames[0])

    try:
        srv.hold("A", "T")
        head = ask({"op": "pull", "req": "A", "lease_s": 0})
        assert head["ok"] and head["kv"] == kv
        assert ask({"op": "done", "req": "A", "lease": head["lease"], "from": "d/0",
                    "consumers": 2})["ok"]
        assert srv.take_released() == set() and srv.held() == {"A"}
        ask({"op": "done", "req": "A", "from": "d/0", "consumers": 2})  # a repeat
        assert srv.take_released() == set()
        ask({"op": "done", "req": "A", "from": "d/1", "consumers": 2})
        assert srv.take_released() == {"A"}
        # One decode rank's done before the hold, the other's after.
        ask({"op": "done", "req": "B", "from": "d/1", "consumers": 2})
        srv.hold("B", "T")
        assert srv.take_released() == set() and srv.held() == {"B"}
        ask({"op": "done", "req": "B", "from": "d/0", "consumers": 2})
        assert srv.take_released() == {"B"}
        # An older decode: one done, no fields.
        srv.hold("C", "T")
        ask({"op": "done", "req": "C"})
        assert srv.take_released() == {"C"}
    finally:
        ctx.destroy(linger=0)
        srv.close()
