"""The PD-disaggregation transfer backend "kvbm" with the real sglang 0.5.23:
selected through the plugin entry point installed in the venv, built on
SGLang's own bootstrap server and Common* classes, driven in the order
SGLang's prefill and decode schedulers call it; every transferred byte (K,
V, aux) checked, and pages that must not move checked untouched."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hicache_harness import require_sglang

require_sglang()

import numpy as np  # noqa: E402

import pd_harness as h  # noqa: E402
from pd_harness import AUX_ITEM_LENS, Side, free_port, prefill_send, wait_for  # noqa: E402

from sglang.srt.disaggregation.base import KVPoll  # noqa: E402
from sglang.srt.disaggregation.utils import KVClassType  # noqa: E402

from kvbmgo.sglang import plugin  # noqa: E402

PYTHON_DIR = str(Path(__file__).resolve().parents[2])
HERE = str(Path(__file__).resolve().parent)


@pytest.fixture(scope="module")
def server_args(tmp_path_factory):
    """The runtime context a scheduler publishes, once per process."""
    os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")
    return h.publish(str(tmp_path_factory.mktemp("model")), "prefill", free_port())


class Pair:
    """A bootstrap server, a prefill manager and a decode manager (one
    process), and the requests made over them."""

    def __init__(self, server_args, prefill_pages=16, decode_pages=16, seed=1, **shape):
        from sglang.srt.runtime_context import get_disagg
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.server = plugin.kv_class(KVClassType.BOOTSTRAP_SERVER)("127.0.0.1", self.port)
        wait_healthy(self.addr)  # else the prefill's registration retries after 1 s
        self.P, self.D = Side(prefill_pages, seed=seed, **shape), Side(decode_pages, **shape)
        self.closed = []
        with get_disagg().override(disaggregation_bootstrap_port=self.port):
            self.pm = h.manager(self.P, "prefill", server_args)
        self.dm = h.manager(self.D, "decode", server_args)

    def sender(self, room):
        return plugin.kv_class(KVClassType.SENDER)(self.pm, self.addr, room)

    def receiver(self, room, timeout=10):
        """What decode.py does: parallel info (retried), receiver, init."""
        t0 = time.monotonic()
        while not self.dm.try_ensure_parallel_info(self.addr):
            assert time.monotonic() - t0 < timeout, "no prefill parallel info"
            time.sleep(0.05)
        r = plugin.kv_class(KVClassType.RECEIVER)(self.dm, self.addr, room)
        r.init(0)
        return r

    def close(self):
        for x in (self.pm, self.dm):
            if x not in self.closed:
                x.close()
                self.closed.append(x)
        self.server.close()


def wait_healthy(addr, timeout=10):
    import requests
    t0 = time.monotonic()
    while True:
        try:
            if requests.get(f"http://{addr}/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        assert time.monotonic() - t0 < timeout, f"bootstrap server {addr} not up"
        time.sleep(0.02)


@pytest.fixture
def pair(server_args, request):
    made = []

    def make(**kw):
        p = Pair(server_args, **kw)
        made.append(p)
        return p
    yield make
    for p in made:
        p.close()


def check_bytes(pair, src, dst, aux_src, aux_dst):
    """Every K and V page of every layer, and every aux buffer's row, as the
    prefill had them; every other decode page and aux row still zero."""
    P, D = pair.P, pair.D
    for b in range(len(P.kv)):
        for s, d in zip(src, dst):
            assert np.array_equal(P.page(b, s), D.page(b, d)), \
                f"KV buffer {b}: prefill page {s} -> decode page {d}"
        for d in set(range(D.pages)) - set(dst):
            assert not D.page(b, d).any(), f"buffer {b}: decode page {d} was written"
    for i in range(len(AUX_ITEM_LENS)):
        assert np.array_equal(P.aux[i][aux_src], D.aux[i][aux_dst]), f"aux buffer {i}"
        others = [r for r in range(h.AUX_ROWS) if r != aux_dst]
        assert not D.aux[i][others].any(), f"aux buffer {i}: another row was written"


def failure(x):
    from sglang.srt.disaggregation.common.conn import KVTransferError
    with pytest.raises(KVTransferError) as e:
        x.failure_exception()
    return str(e.value)


# ---- selection through the plugin entry point

# (Importing kvbmgo.sglang and its plugin lazily: test_hicache.py's import test.)


def test_entry_point_selects_kvbm():
    """SGLang's own load_plugins() finds the entry point in the venv; then
    TransferBackend("kvbm") and get_kv_class (and the copies prefill.py,
    decode.py and disagg_service.py imported) give kvbm's classes, other
    backends SGLang's."""
    from importlib.metadata import entry_points
    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("kvbm") == "kvbmgo.sglang.plugin:register", (
        f"the kvbm plugin is not installed in this venv ({eps}); scripts/engine-venv.sh "
        f"sglang installs it")
    import sglang.srt.disaggregation.decode as decode
    import sglang.srt.disaggregation.prefill as prefill
    import sglang.srt.managers.disagg_service as disagg_service
    from sglang.srt.arg_groups.choices import DISAGG_TRANSFER_BACKEND_CHOICES
    from sglang.srt.disaggregation import utils
    from sglang.srt.disaggregation.base import KVArgs
    from sglang.srt.disaggregation.fake import FakeKVManager
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from kvbmgo.sglang import (KvbmKVBootstrapServer, KvbmKVManager, KvbmKVReceiver,
                               KvbmKVSender)
    kvbm = utils.TransferBackend("kvbm")
    assert kvbm is utils.TransferBackend.KVBM and kvbm.value == "kvbm"
    assert "kvbm" in DISAGG_TRANSFER_BACKEND_CHOICES
    want = {KVClassType.KVARGS: KVArgs, KVClassType.MANAGER: KvbmKVManager,
            KVClassType.SENDER: KvbmKVSender, KVClassType.RECEIVER: KvbmKVReceiver,
            KVClassType.BOOTSTRAP_SERVER: KvbmKVBootstrapServer}
    for mod in (utils, prefill, decode, disagg_service):
        for t, cls in want.items():
            assert mod.get_kv_class(kvbm, t) is cls, (mod.__name__, t)
        assert mod.get_kv_class(utils.TransferBackend.FAKE, KVClassType.MANAGER) \
            is FakeKVManager
    plugin.register()  # idempotent
    assert utils.get_kv_class(kvbm, KVClassType.MANAGER) is KvbmKVManager


def test_cli_and_bootstrap_service_take_kvbm(server_args, tmp_path):
    """The launcher's argument parser accepts the name once the plugin ran,
    and SGLang's own disaggregation service starts kvbm's bootstrap server
    from the published settings (prefill, backend "kvbm")."""
    from sglang.srt.managers.disagg_service import start_disagg_service
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from kvbmgo.sglang import KvbmKVBootstrapServer

    load_plugins()
    parsed = prepare_server_args(["--model-path", server_args.model_path,
                                  "--skip-tokenizer-init", "--device", "cpu",
                                  "--disaggregation-mode", "decode",
                                  "--disaggregation-transfer-backend", "kvbm"])
    assert parsed.disaggregation_transfer_backend == "kvbm"
    s = start_disagg_service()
    try:
        assert type(s) is KvbmKVBootstrapServer
    finally:
        s.close()
    assert not s.thread.is_alive()


# ---- one process: prefill and decode managers, SGLang's bootstrap server

@pytest.mark.parametrize("chunks,shape", [(1, {}), (3, {}), (2, {"mla": True}),
                                          (2, {"draft": True})],
                         ids=["mha-1-chunk", "mha-3-chunks", "mla", "mha+draft"])
def test_transfer_success_every_byte(pair, chunks, shape):
    """The scheduler's call order, one or more chunks; MHA (K and V per
    layer), MLA (one buffer per layer), and a draft pool whose pages are
    smaller (a second kvbm layout)."""
    p = pair(**shape)
    src, dst = [3, 7, 1, 9, 4, 12], [10, 2, 5, 0, 14, 6]
    room = 4242 + chunks
    sender = p.sender(room)
    assert sender.poll() == KVPoll.Bootstrapping
    recv = p.receiver(room)
    assert recv.poll() == KVPoll.WaitingForInput
    assert sender.poll() == KVPoll.Bootstrapping  # nothing reserved yet
    recv.send_metadata(np.array(dst, np.int32), 6, [], decode_prefix_len=0)
    wait_for(sender.poll, KVPoll.WaitingForInput, 10, "prefill")
    assert recv.poll() == KVPoll.WaitingForInput
    assert sender.pop_decode_prefix_len() == 0
    sender.init(len(src), 3)
    parts = np.array_split(np.array(src, np.int32), chunks)
    done = 0
    for part in parts[:-1]:
        # Pages handed over, the last chunk not yet: both sides Transferring;
        # the decode pulls these pages while the prefill computes the next
        # chunk, and still has no aux row (it comes with the last).
        sender.send(part, None, num_kv_tokens=len(part) * h.PAGE)
        wait_for(recv.poll, KVPoll.Transferring, 10, "decode")
        done += len(part)
        t0 = time.monotonic()
        while not all(np.array_equal(p.P.page(b, s), p.D.page(b, d)) for b in range(len(p.P.kv))
                      for s, d in zip(src[:done], dst[:done])):
            assert time.monotonic() - t0 < 10, "the early chunk's pages never arrived"
            time.sleep(0.01)
        assert not any(p.D.page(b, d).any() for b in range(len(p.P.kv)) for d in dst[done:])
        assert sender.poll() == KVPoll.Transferring and recv.poll() == KVPoll.Transferring
        assert not any(a.any() for a in p.D.aux)
    sender.send(parts[-1], [], num_kv_tokens=len(parts[-1]) * h.PAGE)
    seen = {"decode": [], "prefill": []}
    for who, x in (("decode", recv), ("prefill", sender)):
        t0 = time.monotonic()
        while not seen[who] or seen[who][-1] != KVPoll.Success:
            seen[who].append(x.poll())
            assert time.monotonic() - t0 < 10, (who, seen[who][-5:])
            time.sleep(0.001)
    # KVPoll only moves forward: ... Transferring -> Success, never Failed.
    for who, states in seen.items():
        assert KVPoll.Failed not in states and states == sorted(states), (who, states)
    check_bytes(p, src, dst, 3, 6)
    m = sender.get_transfer_metric()
    assert m.transfer_total_bytes == len(src) * sum(p.P.items)
    recv.clear()
    sender.clear()


def test_many_requests_at_once(pair):
    """Interleaved requests on one pair of managers: each lands where its
    receiver reserved, with its own aux row."""
    p = pair(prefill_pages=32, decode_pages=32)
    rng = np.random.default_rng(5)
    reqs = []
    srcs = rng.permutation(32)
    dsts = rng.permutation(32)
    for i in range(4):
        room = 900 + i
        s = p.sender(room)
        r = p.receiver(room)
        src, dst = srcs[i * 8:(i + 1) * 8].tolist(), dsts[i * 8:(i + 1) * 8].tolist()
        # decode_prefix_len: tokens the decode already holds (its radix cache)
        r.send_metadata(np.array(dst, np.int32), i, [], decode_prefix_len=i * h.PAGE)
        reqs.append((room, s, r, src, dst, i))
    for room, s, r, src, dst, i in reversed(reqs):
        wait_for(s.poll, KVPoll.WaitingForInput, 10, "prefill")
        assert s.pop_decode_prefix_len() == i * h.PAGE
        prefill_send(s, src, 7 - i, chunks=2)
    for room, s, r, src, dst, i in reqs:
        wait_for(r.poll, KVPoll.Success, 10, f"decode {room}")
        wait_for(s.poll, KVPoll.Success, 10, f"prefill {room}")
    P, D = p.P, p.D
    for room, s, r, src, dst, i in reqs:
        for b in range(len(P.kv)):
            for a, c in zip(src, dst):
                assert np.array_equal(P.page(b, a), D.page(b, c)), (room, b, a, c)
        for k in range(len(AUX_ITEM_LENS)):
            assert np.array_equal(P.aux[k][7 - i], D.aux[k][i]), (room, k)


def test_silent_prefill_fails_within_waiting_timeout(pair, monkeypatch):
    """The prefill never sends (its request never runs): the decode gives up
    after SGLANG_DISAGGREGATION_WAITING_TIMEOUT, says why, and the decode
    pages are never written."""
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "2")
    p = pair()
    room = 77
    sender = p.sender(room)
    recv = p.receiver(room)
    recv.send_metadata(np.array([1, 2], np.int32), 0, [], decode_prefix_len=0)
    wait_for(sender.poll, KVPoll.WaitingForInput, 10, "prefill")
    state, took = wait_for(recv.poll, {KVPoll.Failed}, 10, "decode")
    assert 2.0 <= took + 0.05 and took < 4.0, took
    why = failure(recv)
    assert "timed out" in why and "WAITING_TIMEOUT" in why, why
    # The decode told the prefill: it fails too, at once, not after its own timeout.
    state, took = wait_for(sender.poll, {KVPoll.Failed}, 2, "prefill")
    assert "decode" in failure(sender)
    assert not p.D.kv_any() and not any(a.any() for a in p.D.aux)


def test_killed_prefill_fails_by_heartbeat(pair, monkeypatch):
    """The prefill instance dies (its bootstrap server and manager go away)
    while the decode waits: the decode's heartbeat fails it after
    HEARTBEAT_INTERVAL x HEARTBEAT_MAX_FAILURE, long before the waiting
    timeout."""
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "60")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "2")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "1")
    p = pair()
    room = 78
    sender = p.sender(room)
    recv = p.receiver(room)
    recv.send_metadata(np.array([1, 2, 3], np.int32), 0, [], decode_prefix_len=0)
    wait_for(sender.poll, KVPoll.WaitingForInput, 10, "prefill")
    p.pm.close()
    p.closed.append(p.pm)
    p.server.close()
    state, took = wait_for(recv.poll, {KVPoll.Failed}, 8, "decode")
    assert took < 6.5, took
    assert "Lost connection with prefill" in failure(recv)
    assert not p.D.kv_any()


def test_silent_decode_fails_the_prefill(pair, monkeypatch):
    """No decode ever reserves: the prefill gives up after
    SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT. A decode that dies after
    reserving never confirms the pull: the prefill gives up after
    SGLANG_DISAGGREGATION_WAITING_TIMEOUT from its last chunk."""
    monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "2")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "2")
    p = pair()
    lonely = p.sender(80)
    sender = p.sender(81)
    recv = p.receiver(81)
    recv.send_metadata(np.array([4, 5], np.int32), 1, [], decode_prefix_len=0)
    wait_for(sender.poll, KVPoll.WaitingForInput, 10, "prefill")
    p.dm.close()  # the decode dies before the pages are handed over
    p.closed.append(p.dm)
    t0 = time.monotonic()
    prefill_send(sender, [0, 1], 0)
    state, _ = wait_for(sender.poll, {KVPoll.Failed}, 8, "prefill")
    took = time.monotonic() - t0
    assert 1.9 <= took < 4.0, took
    # Or, where the prefill's socket to the decode had not yet seen it go,
    # telling the decode of the pages times out after as long (see
    # test_message_to_a_decode_just_gone_waits_no_longer_than_the_timeout).
    why = failure(sender)
    assert "did not confirm" in why or "telling decode" in why, why
    state, took = wait_for(lonely.poll, {KVPoll.Failed}, 8, "prefill without a decode")
    assert "Bootstrapping" in failure(lonely)
    assert not p.D.kv_any()


def test_message_to_a_decode_just_gone_waits_no_longer_than_the_timeout(pair, monkeypatch):
    """A decode dies after the prefill told it of a first chunk, and the
    prefill's socket has not yet seen it go (its disconnection event not
    yet read): SGLang's socket would hold the next message for 30 s; the
    prefill gives up after SGLANG_DISAGGREGATION_WAITING_TIMEOUT and says
    why."""
    import zmq
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "2")
    p = pair()
    sender = p.sender(83)
    recv = p.receiver(83)
    recv.send_metadata(np.array([4, 5, 6, 7], np.int32), 1, [], decode_prefix_len=0)
    wait_for(sender.poll, KVPoll.WaitingForInput, 10, "prefill")
    pages = np.array([0, 1, 2, 3], np.int32)
    sender.init(len(pages), 1)
    sender.send(pages[:2], None, num_kv_tokens=2 * h.PAGE)  # the decode's socket is made and used
    assert len(p.pm._monitor_cache) == 1, p.pm._monitor_cache
    (monitor,) = p.pm._monitor_cache.values()
    p.dm.close()
    p.closed.append(p.dm)
    # Read the disconnection before the prefill does, as if the next message
    # went out before the event arrived.
    deadline = time.monotonic() + 5
    while True:
        try:
            monitor.recv_multipart(zmq.NOBLOCK)
            break
        except zmq.Again:
            assert time.monotonic() < deadline, "the prefill's socket never saw the decode go"
            time.sleep(0.01)
    t0 = time.monotonic()
    sender.send(pages[2:], [], num_kv_tokens=2 * h.PAGE)
    state, _ = wait_for(sender.poll, {KVPoll.Failed}, 8, "prefill")
    took = time.monotonic() - t0
    assert 1.9 <= took < 4.0, took
    assert "telling decode" in failure(sender)


def test_decode_abort(pair):
    """An aborted decode request ends Failed at once, tells the prefill
    (Failed too), and a late hand-over of pages writes nothing."""
    p = pair()
    room = 90
    sender = p.sender(room)
    recv = p.receiver(room)
    recv.send_metadata(np.array([8, 9, 10], np.int32), 2, [], decode_prefix_len=0)
    wait_for(sender.poll, KVPoll.WaitingForInput, 10, "prefill")
    recv.abort()
    assert recv.poll() == KVPoll.Failed
    wait_for(sender.poll, {KVPoll.Failed}, 3, "prefill")
    prefill_send(sender, [1, 2, 3], 1)  # the scheduler may still send: nothing moves
    time.sleep(0.3)
    assert "Aborted" in failure(recv)
    assert "bort" in failure(sender)
    assert not p.D.kv_any() and not any(a.any() for a in p.D.aux)


def test_prefill_abort(pair):
    """An aborted prefill request tells the decode, which ends Failed with
    the reason, without waiting for its timeout."""
    p = pair()
    room = 91
    sender = p.sender(room)
    recv = p.receiver(room)
    recv.send_metadata(np.array([8, 9], np.int32), 2, [], decode_prefix_len=0)
    wait_for(sender.poll, KVPoll.WaitingForInput, 10, "prefill")
    sender.abort()
    assert sender.poll() == KVPoll.Failed
    state, took = wait_for(recv.poll, {KVPoll.Failed}, 3, "decode")
    assert "Aborted by the prefill" in failure(recv)
    assert not p.D.kv_any()


def test_state_indices_without_state_buffers_are_refused_with_the_reason(pair):
    """State indices for a manager SGLang gave no state buffers fail the
    room with the reason on the decode, instead of moving the KV without
    them (state buffers themselves: test_pd_state.py)."""
    p = pair()
    room = 93
    p.sender(room)
    recv = p.receiver(room)
    recv.send_metadata(np.array([1, 2], np.int32), 0, [[3]], decode_prefix_len=0)
    assert recv.poll() == KVPoll.Failed
    assert "state" in failure(recv)


def test_prefill_complete_policy_is_refused(server_args):
    from sglang.srt.runtime_context import get_disagg
    with get_disagg().override(disaggregation_decode_allocation_policy="prefill_complete"):
        with pytest.raises(ValueError, match="prefill_complete"):
            h.manager(Side(4), "decode", server_args)


def test_mismatched_layouts_fail_with_the_reason(pair, server_args):
    """A decode whose aux buffers differ from the prefill's: the request
    fails with the reason instead of writing misaligned rows."""
    p = pair()
    other = Side(16)
    other.aux = other.aux[:-1]  # one metadata buffer fewer
    dm = h.manager(other, "decode", server_args)
    try:
        room = 92
        sender = p.sender(room)
        t0 = time.monotonic()
        while not dm.try_ensure_parallel_info(p.addr):
            assert time.monotonic() - t0 < 10
            time.sleep(0.05)
        recv = plugin.kv_class(KVClassType.RECEIVER)(dm, p.addr, room)
        recv.init(0)
        recv.send_metadata(np.array([1], np.int32), 0, [], decode_prefix_len=0)
        wait_for(sender.poll, KVPoll.WaitingForInput, 10, "prefill")
        prefill_send(sender, [2], 0)
        wait_for(recv.poll, {KVPoll.Failed}, 5, "decode")
        assert "differ" in failure(recv)
        wait_for(sender.poll, {KVPoll.Failed}, 5, "prefill")
        assert not other.kv_any()
    finally:
        dm.close()


# ---- two processes: the prefill in a subprocess

TWO = dict(room=555, seed=11, aux_row=2, src=[5, 1, 7, 3], dst=[0, 6, 2, 9])


@pytest.fixture(scope="module", autouse=True)
def prefill_process(tmp_path_factory):
    """The two-process test's prefill (pd_harness.py run as a script),
    started with the module so that its imports of sglang (the better part
    of its run) overlap the other tests; None when kvbm has no transport
    between processes."""
    import kvbmgo
    if getattr(kvbmgo.info(), "transport", "loopback") in (None, "loopback"):
        yield None
        return
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYTHON_DIR, HERE]),
               SGLANG_HOST_IP="127.0.0.1")
    d = tmp_path_factory.mktemp("prefill")
    log = open(d / "stderr.log", "w")  # a file: nobody reads a pipe while other tests run
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "pd_harness.py"), str(port),
                             str(TWO["room"]), str(TWO["seed"]), json.dumps(TWO["src"]),
                             str(TWO["aux_row"]), str(d / "model")],
                            env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    proc.log_path = d / "stderr.log"
    try:
        yield proc, port
    finally:
        log.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_two_processes(prefill_process, server_args, monkeypatch):
    """The prefill in a subprocess (its own bootstrap server and manager):
    one request's pages cross over kvbm's transport, every byte checked;
    then the prefill is killed (SIGKILL) while the decode waits for a second
    request, which fails by the heartbeat, well before the waiting timeout."""
    if prefill_process is None:
        pytest.skip("cross-process transport not available (issue 11)")
    proc, port = prefill_process
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "60")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "2")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "1")
    room, seed, aux_row, src, dst = (TWO[k] for k in ("room", "seed", "aux_row", "src", "dst"))

    def event():
        line = proc.stdout.readline()
        assert line, (f"the prefill process said nothing more: "
                      f"{proc.log_path.read_text()[-3000:]}")
        return json.loads(line)
    try:
        assert event() == {"event": "ready"}
        D = Side(16)
        dm = h.manager(D, "decode", server_args)
        try:
            addr = f"127.0.0.1:{port}"
            t0 = time.monotonic()
            while not dm.try_ensure_parallel_info(addr):
                assert time.monotonic() - t0 < 20
                time.sleep(0.05)
            recv = plugin.kv_class(KVClassType.RECEIVER)(dm, addr, room)
            recv.init(0)
            recv.send_metadata(np.array(dst, np.int32), 4, [], decode_prefix_len=0)
            wait_for(recv.poll, KVPoll.Success, 30, "decode")
            assert event() == {"event": "done", "state": int(KVPoll.Success)}
            P = Side(4 * len(src) + 4, seed=seed)  # the same bytes as the subprocess's
            for b in range(len(P.kv)):
                for s, d in zip(src, dst):
                    assert np.array_equal(P.page(b, s), D.page(b, d)), (b, s, d)
                for d in set(range(D.pages)) - set(dst):
                    assert not D.page(b, d).any(), (b, d)
            for i in range(len(AUX_ITEM_LENS)):
                assert np.array_equal(P.aux[i][aux_row], D.aux[i][4])
            written = [b.copy() for b in D.kv]
            recv.clear()

            second = plugin.kv_class(KVClassType.RECEIVER)(dm, addr, room + 1)
            second.init(0)
            second.send_metadata(np.array([11, 12], np.int32), 5, [], decode_prefix_len=0)
            assert event() == {"event": "reserved"}
            proc.kill()
            proc.wait(10)
            state, took = wait_for(second.poll, {KVPoll.Failed}, 10, "decode after the kill")
            assert took < 6.5, took
            assert "Lost connection with prefill" in failure(second)
            assert all(np.array_equal(a, b) for a, b in zip(written, D.kv))
            assert not D.aux[0][5].any()
        finally:
            dm.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- authentication of the control messages (KVBM_AUTH_KEY), forged frames

KEY = "kvbm-test-deployment-key-0123456789abcdef"


class Attacker:
    """A pyzmq peer with network reach to both managers: it listens where
    it asks the prefill to send metadata, and pushes forged frames."""

    def __init__(self, key=None):
        import uuid
        import zmq
        from kvbmgo.sglang.pd_wire import Auth
        self.ctx = zmq.Context()
        self.inbox = self.ctx.socket(zmq.PULL)
        self.port = self.inbox.bind_to_random_port("tcp://127.0.0.1")
        self.token = uuid.uuid4().hex
        self.auth = Auth(key.encode() if isinstance(key, str) else key, self.token, "attacker")
        self.socks = {}

    def push(self, port, frames, sign=True):
        """Pushes frames to the manager at port, signed for it (with a key)."""
        import zmq
        from kvbmgo._control import endpoint
        s = self.socks.get(port)
        if s is None:
            s = self.socks[port] = self.ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(f"tcp://127.0.0.1:{port}")
        s.send_multipart(self.auth.sign(frames, endpoint("127.0.0.1", port)) if sign
                         else list(frames))

    def received(self, wait=0.3):
        import zmq
        got = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < wait:
            try:
                got.append(self.inbox.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                time.sleep(0.02)
        return got

    def close(self):
        for s in self.socks.values():
            s.close(linger=0)
        self.inbox.close(linger=0)
        self.ctx.term()


def started(p, room, dst, aux_row):
    """A genuine request up to the point where the prefill may send."""
    sender = p.sender(room)
    recv = p.receiver(room)
    recv.send_metadata(np.array(dst, np.int32), aux_row, [], decode_prefix_len=0)
    wait_for(sender.poll, KVPoll.WaitingForInput, 10, "prefill")
    return sender, recv


def forged(p, a, room):
    """Every forged control message of issue 21, aimed at room: a
    registration (metadata to the attacker), a reservation for the room
    (its page indices and aux row to the attacker), a release that fails it
    (naming the genuine decode), and a hand-over that would make the decode
    pull other pages and write a chosen aux row (naming the genuine prefill)."""
    from kvbmgo.sglang import pd_wire as wire
    pm, dm = p.pm, p.dm
    return [
        (pm.rank_port, wire.registration("127.0.0.1", a.port, a.token, pm.signature, "n")),
        (pm.rank_port, wire.TransferInfo(room=room, endpoint="127.0.0.1", dst_port=a.port,
                                         peer=a.token, num_pages=3, required_dst_info_num=1,
                                         decode_prefix_len=0, is_dummy=False).frames()),
        (pm.rank_port, wire.done(room, dm.token, KVPoll.Failed, "forged")),
        (dm.rank_port, wire.pull(room, pm.token, 0, 0, np.array([0, 2, 4], np.int32), True,
                                 [], [b"\xee" * n for n in AUX_ITEM_LENS])),
    ]


def finish_genuine(p, sender, recv, src, dst, aux_src, aux_dst):
    prefill_send(sender, src, aux_src)
    wait_for(recv.poll, KVPoll.Success, 10, "decode")
    wait_for(sender.poll, KVPoll.Success, 10, "prefill")
    check_bytes(p, src, dst, aux_src, aux_dst)


def test_auth_key_genuine_handoff_every_byte(pair, monkeypatch):
    """KVBM_AUTH_KEY on both sides: the hand-off passes byte for byte, every
    frame authenticated, none refused."""
    monkeypatch.setenv("KVBM_AUTH_KEY", KEY)
    p = pair()
    assert p.pm.auth.enabled and p.dm.auth.enabled
    src, dst = [3, 7, 1, 9], [10, 2, 5, 0]
    sender, recv = started(p, 2100, dst, 6)
    finish_genuine(p, sender, recv, src, dst, 3, 6)
    assert p.pm.auth.refused == {} and p.dm.auth.refused == {}


def test_auth_key_file(pair, monkeypatch, tmp_path):
    """The key from KVBM_AUTH_KEY_FILE works as KVBM_AUTH_KEY; a short key
    or both variables refuse the manager."""
    from kvbmgo._control import load_key
    f = tmp_path / "key"
    f.write_text(KEY + "\n")
    f.chmod(0o600)
    monkeypatch.setenv("KVBM_AUTH_KEY_FILE", str(f))
    assert load_key() == KEY.encode()
    p = pair()
    sender, recv = started(p, 2101, [1, 2], 1)
    finish_genuine(p, sender, recv, [4, 5], [1, 2], 0, 1)
    monkeypatch.setenv("KVBM_AUTH_KEY", KEY)
    with pytest.raises(ValueError, match="not both"):
        load_key()
    monkeypatch.delenv("KVBM_AUTH_KEY_FILE")
    monkeypatch.setenv("KVBM_AUTH_KEY", "short")
    with pytest.raises(ValueError, match="at least 16"):
        load_key()


@pytest.mark.parametrize("attacker_key", [None, "a-wrong-key-of-the-same-length-000000000"],
                         ids=["no-key", "wrong-key"])
def test_forged_frames_without_the_key_change_nothing(pair, monkeypatch, caplog, attacker_key):
    """With the key on both sides, forged KVBM_REG/ROOM/DONE/PULL without it
    (or under a wrong one) are refused: no metadata or reservation reaches
    the attacker, the room is not failed, no page or aux row is written;
    each refusal is logged once per peer; the genuine request completes."""
    import logging
    monkeypatch.setenv("KVBM_AUTH_KEY", KEY)
    p = pair()
    a = Attacker(attacker_key)
    try:
        src, dst = [3, 7, 1], [10, 2, 5]
        sender, recv = started(p, 2200, dst, 6)
        with caplog.at_level(logging.WARNING, logger="kvbmgo._control"):
            for _ in range(2):  # twice: logged once
                for port, frames in forged(p, a, 2200):
                    a.push(port, frames)
            assert a.received() == [], "the attacker got a reply"
            t0 = time.monotonic()
            while sum(p.pm.auth.refused.values()) < 6 or sum(p.dm.auth.refused.values()) < 2:
                assert time.monotonic() - t0 < 5, (p.pm.auth.refused, p.dm.auth.refused)
                time.sleep(0.02)
        reason = "unauthenticated" if attacker_key is None else "bad mac"
        assert set(p.pm.auth.refused) == {reason} and set(p.dm.auth.refused) == {reason}
        lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(lines) == len(set(lines)), lines
        assert any("KVBM_REG" in m and f"127.0.0.1:{a.port}" in m for m in lines), lines
        assert a.token not in p.pm.decode_kv_args_table
        assert list(p.pm.transfer_infos[2200]) == [p.dm.token]
        assert sender.poll() == KVPoll.WaitingForInput and recv.poll() == KVPoll.WaitingForInput
        assert not p.D.kv_any() and not any(x.any() for x in p.D.aux)
        finish_genuine(p, sender, recv, src, dst, 3, 6)
    finally:
        a.close()


def test_frames_from_another_decode_or_prefill_refused_even_with_the_key(pair, monkeypatch):
    """A holder of the key that is not the room's decode: its KVBM_ROOM for
    a room already reserved and its KVBM_DONE for it are refused, as are
    frames naming the genuine decode or prefill but authenticated as
    itself, and a KVBM_PULL from a prefill the bootstrap server did not
    assign to the room. The genuine request completes."""
    from kvbmgo.sglang import pd_wire as wire
    monkeypatch.setenv("KVBM_AUTH_KEY", KEY)
    p = pair()
    a = Attacker(KEY)
    try:
        src, dst = [6, 2, 8], [1, 3, 4]
        room = 2300
        sender, recv = started(p, room, dst, 2)
        pm, dm = p.pm, p.dm
        # A member may register (it holds the key): it gets the prefill's
        # metadata, answering its own nonce.
        a.push(pm.rank_port, wire.registration("127.0.0.1", a.port, a.token, pm.signature, "n1"))
        got = a.received(1.0)
        assert len(got) == 1 and got[0][0] == wire.TAG_META and got[0][6] == b"n1"
        for port, frames in [
            (pm.rank_port, wire.TransferInfo(room=room, endpoint="127.0.0.1", dst_port=a.port,
                                             peer=a.token, num_pages=3, required_dst_info_num=1,
                                             decode_prefix_len=0, is_dummy=False).frames()),
            (pm.rank_port, wire.done(room, a.token, KVPoll.Failed, "not yours")),
            (pm.rank_port, wire.done(room, dm.token, KVPoll.Failed, "names the decode")),
            (dm.rank_port, wire.pull(room, pm.token, 0, 0, np.array([0], np.int32), True, [], [])),
            (dm.rank_port, wire.pull(room, a.token, 0, 0, np.array([0], np.int32), True,
                                     [], [b"\xee" * n for n in AUX_ITEM_LENS])),
            (dm.rank_port, wire.layouts(a.token, 0, dm.signature, "127.0.0.1", a.port, "x")),
        ]:
            a.push(port, frames)
        assert a.received() == []
        want_p = {"room taken": 1, "not the room's decode": 1, "not its sender": 1}
        want_d = {"not its sender": 1, "not the room's prefill": 1, "unexpected layouts": 1}
        t0 = time.monotonic()
        while pm.auth.refused != want_p or dm.auth.refused != want_d:
            assert time.monotonic() - t0 < 5, (pm.auth.refused, dm.auth.refused)
            time.sleep(0.02)
        assert list(pm.transfer_infos[room]) == [dm.token]
        assert sender.poll() == KVPoll.WaitingForInput and recv.poll() == KVPoll.WaitingForInput
        assert not p.D.kv_any() and not any(x.any() for x in p.D.aux)
        finish_genuine(p, sender, recv, src, dst, 0, 2)
    finally:
        a.close()


def test_forged_frames_without_any_key_bound_to_the_room(pair, monkeypatch):
    """No key anywhere (opted out: KVBM_PD_ALLOW_UNAUTHENTICATED=1): a
    KVBM_DONE naming a token that is not the room's decode, a KVBM_ROOM from
    a decode that never registered and a KVBM_PULL naming an unknown
    prefill are refused; the genuine request completes."""
    from kvbmgo.sglang import pd_wire as wire
    monkeypatch.setenv("KVBM_PD_ALLOW_UNAUTHENTICATED", "1")
    p = pair()
    assert not p.pm.auth.enabled and not p.dm.auth.enabled
    a = Attacker(None)
    try:
        src, dst = [5, 9], [7, 8]
        room = 2400
        sender, recv = started(p, room, dst, 1)
        pm, dm = p.pm, p.dm
        a.push(pm.rank_port, wire.TransferInfo(room=room, endpoint="127.0.0.1", dst_port=a.port,
                                               peer=a.token, num_pages=2,
                                               required_dst_info_num=1, decode_prefix_len=0,
                                               is_dummy=False).frames())
        a.push(pm.rank_port, wire.done(room, a.token, KVPoll.Failed, "any room by number"))
        a.push(dm.rank_port, wire.pull(room, a.token, 0, 0, np.array([0], np.int32), True, [], []))
        assert a.received() == []
        t0 = time.monotonic()
        while sum(pm.auth.refused.values()) < 2 or sum(dm.auth.refused.values()) < 1:
            assert time.monotonic() - t0 < 5, (pm.auth.refused, dm.auth.refused)
            time.sleep(0.02)
        assert set(pm.auth.refused) == {"unregistered decode", "not the room's decode"}
        assert set(dm.auth.refused) == {"not the room's prefill"}
        finish_genuine(p, sender, recv, src, dst, 4, 1)
    finally:
        a.close()


def test_key_on_one_side_only_is_refused_with_a_clear_line(pair, monkeypatch, caplog):
    """The prefill has the key, the decode has none: the decode's
    registration and reservation are refused (logged once, naming the
    variable), no metadata goes out, and the request fails by its timeout
    on the decode; nothing is written."""
    import logging
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "2")
    monkeypatch.setenv("KVBM_PD_ALLOW_UNAUTHENTICATED", "1")
    p = pair()  # no key in the decode: made first, under the prefill's key below
    from kvbmgo.sglang.pd_wire import Auth
    p.pm.auth = Auth(KEY.encode(), p.pm.token, "prefill", me=p.pm.auth.me)
    with caplog.at_level(logging.WARNING, logger="kvbmgo._control"):
        sender = p.sender(2500)
        recv = p.receiver(2500)
        recv.send_metadata(np.array([1, 2], np.int32), 0, [], decode_prefix_len=0)
        wait_for(recv.poll, {KVPoll.Failed}, 8, "decode")
    assert p.pm.auth.refused.get("unauthenticated", 0) >= 2
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert lines and all("KVBM_AUTH_KEY" in m for m in lines), lines
    assert len(lines) == len(set(lines)), lines
    assert not p.dm.side.layouts and not p.D.kv_any()
    assert sender.poll() == KVPoll.Bootstrapping


def test_auth_replay_stale_and_tamper():
    """A frame seen before, one stamped outside the window, one altered:
    refused; a fresh one taken, its sender named."""
    from kvbmgo import _control
    from kvbmgo.sglang import pd_wire as wire
    a = wire.Auth(KEY.encode(), "sender", "prefill")
    b = wire.Auth(KEY.encode(), "me", "decode", me="127.0.0.1:1")
    msg = a.sign([b"KVBM_DONE", b"1", b"sender", b"4", b""], "127.0.0.1:1")
    assert b.open(list(msg)) == (msg[:-3], "sender")
    assert b.open(list(msg)) is None and b.refused == {"replay": 1}
    bad = list(a.sign([b"KVBM_DONE", b"1", b"sender", b"4", b""], "127.0.0.1:1"))
    bad[1] = b"2"
    assert b.open(bad) is None and b.refused["bad mac"] == 1
    old = time.time_ns() - int(2 * _control.WINDOW_S * 1e9)
    stamp = f"sender\n127.0.0.1:1\n{old}\n00".encode()
    frames = [b"KVBM_DONE", b"1"]
    stale = frames + [_control.AUTH_TAG, stamp,
                      _control.mac(KEY.encode(), wire.AUTH_DOMAIN, frames, stamp)]
    assert b.open(stale) is None and b.refused["stale"] == 1
    assert wire.Auth(None, "x", "decode").open(a.sign(frames, "127.0.0.1:1")) is None


def test_an_oversized_control_frame_is_refused_unread(pair, monkeypatch):
    """A control message over the cap (pd_wire.CONTROL_MAX) is dropped by libzmq
    as it arrives: the prefill's handler never sees it, and a small forged
    one sent after it is refused as usual."""
    import zmq
    from kvbmgo.sglang import pd_wire as wire
    monkeypatch.setattr(wire, "CONTROL_MAX", 1 << 20)
    p = pair()
    pm = p.pm
    assert pm.server_socket.getsockopt(zmq.MAXMSGSIZE) == 1 << 20
    # The small one under the key (the same-host one): it reaches the handler.
    from kvbmgo._control import same_host_key
    big, small = Attacker(None), Attacker(same_host_key()[0])
    try:
        def room(a, endpoint):
            return wire.TransferInfo(room=2500, endpoint=endpoint, dst_port=a.port, peer=a.token,
                                     num_pages=1, required_dst_info_num=1, decode_prefix_len=0,
                                     is_dummy=False).frames()
        big.push(pm.rank_port, room(big, "127.0.0.1" + "x" * (2 << 20)))
        time.sleep(0.3)  # the big one first
        small.push(pm.rank_port, room(small, "127.0.0.1"))
        t0 = time.monotonic()
        while sum(pm.auth.refused.values()) < 1:
            assert time.monotonic() - t0 < 5, pm.auth.refused
            time.sleep(0.02)
        time.sleep(0.5)
        assert dict(pm.auth.refused) == {"unregistered decode": 1}
    finally:
        big.close()
        small.close()
