"""KvbmConnector with the real vLLM scheduler (0.33 and 0.34): offload, onboard, errors."""
from harness import require_vllm

require_vllm()

import os  # noqa: E402

import torch  # noqa: E402

import pytest  # noqa: E402

from harness import BLOCK, LAYERS, Engine, pattern  # noqa: E402


@pytest.fixture
def engine():
    e = Engine({"g2_blocks": 32})
    yield e
    e.close()


def test_b_loads_the_prefix_a_offloaded(engine):
    e = engine
    a_prompt = list(range(100, 100 + 2 * BLOCK + 8))          # 2 full blocks + 8
    a = e.add("A", a_prompt)
    e.run()
    e.settle()  # A's stores done and the scheduler told (A was not held for them)
    a_keys = [bytes(h) for h in a.block_hashes[:2]]
    sched = e.connector._scheduler
    assert all(sched.cached_tiers(k) == {2} for k in a_keys)
    # The GPU forgets A: its blocks are reused, B's hit can only be kvbm's.
    assert e.sched.reset_prefix_cache()
    e.raw.zero_()
    b = e.add("B", a_prompt[:2 * BLOCK] + list(range(500, 510)))
    seen = {}

    def check(so):
        if "B" in so.num_scheduled_tokens and not seen:
            ids = e.block_ids("B")
            seen["ids"] = ids[:2]
            for i, key in enumerate(a_keys):
                for layer in range(len(LAYERS)):
                    assert torch.equal(e.read(ids[i], layer), pattern(key, layer)), \
                        f"block {i} (G1 {ids[i]}) layer {layer}"
            seen["computed"] = e.sched.requests["B"].num_computed_tokens
            seen["scheduled"] = so.num_scheduled_tokens["B"]
    e.run(before_forward=check)
    assert seen["scheduled"] == 10, "B computes only its own 10 tokens"
    # A's blocks went back to vLLM when it finished (its stores ordered
    # before their reuse): never held for finished_sending.
    assert not any(o.finished_sending for o in e.outputs)
    st = e.worker._worker.worker.cache.stats()
    assert st.onboarded == 2 and st.onboarded_from_g2 == 2
    assert [bytes(h) for h in b.block_hashes[:2]] == a_keys


def _lost_block_run(e):
    """A caches 2 blocks; the scheduler's index is told (as a stale event
    would) that B's third block is cached too: B's load of it fails."""
    prompt = list(range(7, 7 + 2 * BLOCK + 1))
    a = e.add("A", prompt)
    e.run()
    e.settle()  # A's stores done and the scheduler told
    assert e.sched.reset_prefix_cache()
    e.raw.zero_()
    b_prompt = prompt[:2 * BLOCK] + list(range(600, 600 + BLOCK + 3))
    b = e.add("B", b_prompt)
    lost = bytes(b.block_hashes[2])
    e.connector._scheduler.apply_events([(1, 2, lost)])
    loads = []

    def check(so):
        for ld in so.kv_connector_metadata.loads:
            loads.append(ld)
    e.run(before_forward=check)
    return a, b, loads


def test_a_block_the_cache_lost_is_reported_and_recomputed(engine):
    e = engine
    a, b, loads = _lost_block_run(e)
    assert len(loads) == 1 and len(loads[0].block_ids) == 3
    lost_id = loads[0].block_ids[2]
    reported = set().union(*(o.invalid_block_ids for o in e.outputs))
    assert reported == {lost_id}
    # Recomputed: B's third block was written by the forward and stored
    # (B's stores are ordered before its blocks' reuse, not awaited by run()).
    e.idle()
    cache = e.worker._worker.worker.cache
    assert cache.match([bytes(h) for h in b.block_hashes[:3]])[0] == 3
    st = cache.stats()
    assert st.onboard_failed >= 1


def test_a_lost_block_fails_the_request_under_policy_fail():
    e = Engine({"g2_blocks": 32}, policy="fail")
    try:
        finished = []
        orig = e.sched.update_from_output

        def spy(so, out):
            eco = orig(so, out)
            for outs in eco.values():
                for o in outs.outputs:
                    if o.finish_reason is not None:
                        finished.append((o.request_id, o.finish_reason))
            return eco
        e.sched.update_from_output = spy
        a, b, loads = _lost_block_run(e)
        reported = set().union(*(o.invalid_block_ids for o in e.outputs))
        assert reported == {loads[0].block_ids[2]}
        assert ("B", "error") in [(r, str(f.name).lower() if hasattr(f, "name") else str(f))
                                  for r, f in finished], finished
    finally:
        e.close()


def _a_then_b(e, a_prompt, b_prompt, before_b=None):
    """A runs to the end (its blocks offloaded); the GPU forgets it; B runs.
    Returns (a, b, bytes_ok) where bytes_ok says B's loaded blocks held A's
    KV, checked in the step B was first scheduled, before its forward."""
    a = e.add("A", a_prompt)
    e.run()
    e.settle()
    assert e.sched.reset_prefix_cache()
    e.raw.zero_()
    if before_b is not None:
        before_b()
    b = e.add("B", b_prompt)
    seen = {}

    def check(so):
        if "B" in so.num_scheduled_tokens and "B" not in seen:
            r = e.sched.requests["B"]
            start = r.num_computed_tokens - so.num_scheduled_tokens["B"]
            ids = e.block_ids("B")
            seen["B"] = start
            seen["ok"] = all(torch.equal(e.read(ids[i], layer), pattern(r.block_hashes[i], layer))
                             for i in range(start // BLOCK) for layer in range(len(LAYERS)))
    e.run(before_forward=check)
    return a, b, seen


@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC", "BLNHC", "BLHNC"])
def test_every_supported_layout_registered_without_a_copy(layout):
    e = Engine({"g2_blocks": 32}, layout=layout)
    try:
        w = e.worker._worker
        # G1 is vLLM's own memory: the registered regions lie in e.raw.
        base, end = e.raw.data_ptr(), e.raw.data_ptr() + e.raw.numel()
        for v in e.views.values():
            assert base <= v.data_ptr() < end
        prompt = list(range(3, 3 + 3 * BLOCK + 5))
        a, b, seen = _a_then_b(e, prompt, prompt[:3 * BLOCK] + [9, 9])
        assert seen["B"] == 3 * BLOCK and seen["ok"]
        assert w.worker.cache.stats().onboarded == 3
    finally:
        e.close()


@pytest.mark.parametrize("layout", ["LHBNC", "BHLNC"])
def test_layouts_without_a_dense_block_are_refused(layout):
    with pytest.raises(ValueError, match="dense region|block stride"):
        Engine({"g2_blocks": 32}, layout=layout)


def test_async_load_waits_outside_the_forward():
    e = Engine({"g2_blocks": 32, "load_mode": "async"})
    try:
        prompt = list(range(50, 50 + 2 * BLOCK + 3))
        states = []
        orig = e.step

        def step(before_forward=None):
            so, kvo = orig(before_forward)
            if "B" in e.sched.requests:
                states.append((e.sched.requests["B"].status.name, kvo.finished_recving))
            return so, kvo
        e.step = step
        a, b, seen = _a_then_b(e, prompt, prompt[:2 * BLOCK] + [1, 2, 3, 4])
        assert seen["B"] == 2 * BLOCK and seen["ok"]
        assert states[0][0] == "WAITING_FOR_REMOTE_KVS", states
        assert [r for _, r in states if r] == [{"B"}], states
    finally:
        e.close()


def test_g2_spills_to_g3_and_b_loads_from_both(tmp_path):
    # One block per step (16-token batches), G2 of 2 blocks: A's first blocks
    # are written back to G3 when later ones push them out of G2.
    e = Engine({"g2_blocks": 2, "g3_dir": str(tmp_path / "g3"), "g3_blocks": 16},
               max_batched=16, serial=True)
    try:
        prompt = list(range(200, 200 + 4 * BLOCK + 1))
        a, b, seen = _a_then_b(e, prompt, prompt[:4 * BLOCK] + [5] * 7)
        assert seen["B"] == 4 * BLOCK and seen["ok"]
        st = e.worker._worker.worker.cache.stats()
        assert st.onboarded_from_g3 >= 1 and st.onboarded_from_g2 >= 1, st
    finally:
        e.close()


def test_a_corrupt_g3_block_is_reported(tmp_path):
    e = Engine({"g2_blocks": 1, "g3_dir": str(tmp_path / "g3"), "g3_blocks": 16},
               max_batched=16, serial=True)
    try:
        prompt = list(range(300, 300 + 3 * BLOCK + 1))

        def corrupt():
            # The G3 file has no name: reached through this process's
            # descriptor of it (/proc/self/fd; written, not truncated).
            g3 = str(tmp_path / "g3") + "/"
            files = {}
            for fd in os.listdir("/proc/self/fd"):
                try:
                    target = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    continue
                if target.startswith(g3):
                    files.setdefault(target, f"/proc/self/fd/{fd}")
            assert files, "G3 has a file"
            assert not [p for p in (tmp_path / "g3").rglob("*") if p.is_file()], \
                "the G3 file has no name"
            for p in files.values():
                with open(p, "r+b") as f:
                    size = os.fstat(f.fileno()).st_size
                    f.write(b"\xaa" * size)
        loads = []
        orig = e.step

        def step(before_forward=None):
            so, kvo = orig(before_forward)
            loads.extend(so.kv_connector_metadata.loads)
            return so, kvo
        e.step = step
        a, b, seen = _a_then_b(e, prompt, prompt[:3 * BLOCK] + [1], before_b=corrupt)
        assert len(loads) == 1
        ids = loads[0].block_ids
        reported = set().union(*(o.invalid_block_ids for o in e.outputs))
        # G2 held the last block; the two before it came from the corrupt G3.
        assert reported == set(ids[:2]), (reported, ids)
    finally:
        e.close()


def test_events_name_the_stored_and_removed_hashes():
    from vllm.distributed.kv_events import BlockRemoved, BlockStored
    e = Engine({"g2_blocks": 2}, max_batched=16, serial=True)
    try:
        batches = []

        class Spy:
            def publish(self, batch):
                batches.append(batch)

            def shutdown(self):
                pass
        e.sched.kv_event_publisher = Spy()
        a = e.add("A", list(range(400, 400 + 3 * BLOCK + 1)))
        e.run()
        events = [ev for bt in batches for ev in bt.events
                  if isinstance(ev, (BlockStored, BlockRemoved)) and ev.medium != "GPU"]
        keys = [bytes(h) for h in a.block_hashes[:3]]
        stored = [bytes(ev.block_hashes[0]) for ev in events if isinstance(ev, BlockStored)]
        removed = [bytes(ev.block_hashes[0]) for ev in events if isinstance(ev, BlockRemoved)]
        assert stored == keys
        assert all(ev.medium == "CPU" for ev in events)
        # G2 holds 2 blocks: the first one left it.
        assert removed == keys[:1]
        first = next(ev for ev in events if isinstance(ev, BlockStored))
        assert list(first.token_ids) == list(range(400, 400 + BLOCK))
        assert first.block_size == BLOCK
    finally:
        e.close()


def test_a_fully_cached_prompt_still_computes_its_last_block(engine):
    # vLLM computes at least one token: a prompt of exactly 3 cached blocks
    # loads 2 and computes the third, as vLLM's own GPU prefix cache does.
    e = engine
    prompt = list(range(800, 800 + 3 * BLOCK))
    a, b, seen = _a_then_b(e, prompt, prompt)
    assert seen["B"] == 2 * BLOCK and seen["ok"]
    assert e.worker._worker.worker.cache.stats().onboarded == 2


def test_preempted_requests_resume_from_the_cache():
    # 6 usable GPU blocks for two requests that each grow to 4: one is
    # preempted, its blocks freed, and it resumes by loading what it had
    # offloaded. Every computed block is checked before every forward.
    e = Engine({"g2_blocks": 32}, num_blocks=7, serial=True)
    e.verify = True
    try:
        preempted = []
        orig = e.step

        def step(before_forward=None):
            so, kvo = orig(before_forward)
            preempted.extend(so.preempted_req_ids or ())
            return so, kvo
        e.step = step
        e.add("A", list(range(900, 900 + 2 * BLOCK - 1)), max_tokens=2 * BLOCK)
        e.add("B", list(range(950, 950 + 2 * BLOCK - 1)), max_tokens=2 * BLOCK)
        e.run()
        assert preempted, "a request was preempted"
        st = e.worker._worker.worker.cache.stats()
        assert st.onboarded >= 1, st  # what the GPU prefix cache no longer had
    finally:
        e.close()


def test_g2_spills_to_g4_and_b_loads_from_it(tmp_path):
    e = Engine({"g2_blocks": 1, "g4_dir": str(tmp_path / "g4")}, max_batched=16, serial=True)
    try:
        prompt = list(range(700, 700 + 3 * BLOCK + 1))
        a, b, seen = _a_then_b(e, prompt, prompt[:3 * BLOCK] + [4, 4])
        assert seen["B"] == 3 * BLOCK and seen["ok"]
        st = e.worker._worker.worker.cache.stats()
        assert st.onboarded_from_g4 >= 1, st
    finally:
        e.close()


def test_a_lost_block_is_reported_with_async_loads():
    e = Engine({"g2_blocks": 32, "load_mode": "async"})
    try:
        a, b, loads = _lost_block_run(e)
        assert len(loads) == 1 and loads[0].is_async
        reported = set().union(*(o.invalid_block_ids for o in e.outputs))
        assert reported == {loads[0].block_ids[2]}
        # Reported in the step whose finished_recving names B, as vLLM requires.
        step = next(o for o in e.outputs if o.finished_recving)
        assert step.finished_recving == {"B"} and step.invalid_block_ids == reported
    finally:
        e.close()


class _LazyStore:
    """A store that reads its G1 blocks as late as its notification's
    contract allows: only when it is waited for (done() is False until
    then), as a slow copy would."""

    def __init__(self, start):
        self._start, self._n = start, None

    def _real(self):
        if self._n is None:
            self._n = self._start()
        return self._n

    def done(self):
        return self._n is not None and self._n.done()

    def wait(self, *a, **kw):
        return self._real().wait(*a, **kw)

    def failed_blocks(self):
        return self._real().failed_blocks()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._real().close()


class _SlowStores:
    """The kvbmgo Worker, but its cache's stores are _LazyStore."""

    def __init__(self, w):
        self._w = w
        outer = self

        class Cache:
            def __getattr__(self, name):
                return getattr(outer._w.cache, name)

            def offload(self, keys, ids, **kw):
                keys, ids = list(keys), list(ids)
                return _LazyStore(lambda: outer._w.cache.offload(keys, ids, **kw)[0]), []
        self.cache = Cache()

    def __getattr__(self, name):
        return getattr(self._w, name)


def _c_loads_as_bytes(e, a, a_prompt):
    """Runs what is left, lets the stores still in flight land, then C =
    A's prompt on a forgotten GPU: every block C loads must hold A's KV
    (checked before every forward)."""
    e.run()
    for st in e.worker._worker._stores:  # the copies still in flight land now
        st.n.wait()
    e.settle()
    assert e.sched.reset_prefix_cache()
    e.raw.zero_()
    e.verify = True
    c = e.add("C", a_prompt)
    e.run()
    assert [bytes(h) for h in c.block_hashes[:3]] == [bytes(h) for h in a.block_hashes[:3]]


def test_a_finished_requests_blocks_are_free_at_once_and_read_before_reuse():
    # 4 usable GPU blocks; A takes all of them. When A finishes, its blocks
    # are back in vLLM's free pool in that step (stores still in flight);
    # B reuses them in the next; the stores read A's KV before B's forward
    # writes them: a request with A's prompt later loads A's bytes.
    e = Engine({"g2_blocks": 32}, num_blocks=5)
    try:
        w = e.worker._worker
        w.worker = _SlowStores(w.worker)
        pool = e.sched.kv_cache_manager.block_pool
        a_prompt = list(range(4000, 4000 + 3 * BLOCK + 1))
        a = e.add("A", a_prompt)
        while "A" not in e.finished:
            e.step()
        assert not e.sched.requests, "A's blocks were held after it finished"
        assert pool.get_num_free_blocks() == 4
        assert w._stores and not any(st.n.done() for st in w._stores)
        a_ids = set().union(*(st.ids for st in w._stores))
        e.add("B", list(range(5000, 5000 + 3 * BLOCK + 1)))
        so, _ = e.step()
        assert a_ids <= set(so.scheduled_new_reqs[0].block_ids[0]), "B reuses A's blocks"
        assert not any("A" in st.reqs for st in w._stores), "A's stores were waited for"
        _c_loads_as_bytes(e, a, a_prompt)
        assert e.worker._worker.worker.cache.stats().onboarded == 3
    finally:
        e.close()


def test_worker_calls_before_registration_and_after_shutdown_do_nothing():
    # vLLM's no-forward path (bind, start_load_kv, wait_for_save,
    # get_finished, clear) before register_kv_caches and after shutdown:
    # no error; a load asked for is reported failed, and an async one
    # finished, so that no request waits for it.
    from kvbmgo.vllm.metadata import BlockLoad, BlockStore, KvbmConnectorMetadata
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    e = Engine({"g2_blocks": 8})
    e.close()
    fresh = KVConnectorFactory.create_connector(e.vc, KVConnectorRole.WORKER, e.kvc)
    for c in (fresh, e.worker):
        md = KvbmConnectorMetadata(
            loads=[BlockLoad("L", [b"k" * 32], [3]), BlockLoad("M", [b"m" * 32], [4], True)],
            stores=[BlockStore("S", [b"s" * 32], [5])], allocated=[3, 4, 5],
            preempted=["S"])
        c.handle_preemptions(md)
        c.bind_connector_metadata(md)
        c.start_load_kv(e.ctx)
        for name in LAYERS:
            c.wait_for_layer_load(name)
        c.wait_for_save()
        assert c.get_finished(set()) == (None, {"M"})
        assert c.get_block_ids_with_load_errors() == {3, 4}
        assert c.build_connector_worker_meta() is None
        c.clear_connector_metadata()
        c.shutdown()


_SIZE_CHILD = """
import json, os, sys
with open("/proc/self/oom_score_adj", "w") as f:
    f.write("1000")  # a regression meets the OOM killer: it takes this child first
sys.path.insert(0, sys.argv[2])
import conftest  # noqa: F401 - its environment
from harness import Engine
from kvbmgo import errors
try:
    Engine(json.loads(sys.argv[1])).close()
    print(json.dumps({"error": None}))
except errors.KvbmError as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
"""


def _mem_total():
    with open("/proc/meminfo") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith("MemTotal:"))


@pytest.mark.parametrize("tier", ["g2", "g3"])
def test_a_tier_the_machine_cannot_hold_fails_at_start(tmp_path, tier):
    """g2_bytes of twice the machine's memory, or g3_bytes beyond the disk's free
    space, fail register_kv_caches at once with the library's message naming the
    bytes requested and available, in a child process (see _SIZE_CHILD)."""
    import json
    import os
    import subprocess
    import sys
    if tier == "g2":
        extra, error, word = {"g2_bytes": 2 * _mem_total()}, "CudaError", " available"
    else:
        st = os.statvfs(tmp_path)
        extra = {"g2_blocks": 8, "g3_dir": str(tmp_path),
                 "g3_bytes": st.f_bavail * st.f_frsize + (1 << 40)}
        error, word = "KvbmIOError", " free"
    r = subprocess.run([sys.executable, "-c", _SIZE_CHILD, json.dumps(extra),
                        os.path.dirname(__file__)], capture_output=True, text=True, timeout=300)
    assert r.returncode >= 0, f"the child was killed by signal {-r.returncode}\n{r.stderr}"
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["error"] == error, out
    assert "bytes requested, " in out["message"] and word in out["message"], out


def test_reset_cache_drops_g2_and_g3(tmp_path):
    # vLLM's reset of the connector's cache (reset_prefix_cache with the
    # connector's): nothing is matched afterwards, the workers drop G2 and
    # G3 (their REMOVED events reach vLLM's event stream), a prompt seen
    # before is computed again and stored anew.
    e = Engine({"g2_blocks": 2, "g3_dir": str(tmp_path), "g3_blocks": 8}, max_batched=16,
               serial=True)
    try:
        prompt = list(range(6000, 6000 + 3 * BLOCK + 1))
        a = e.add("A", prompt)
        e.run()
        e.settle()
        keys = [bytes(h) for h in a.block_hashes[:3]]
        cache = e.worker._worker.worker.cache
        assert cache.match(keys)[0] == 3
        assert e.connector.reset_cache() is True
        assert all(not e.connector._scheduler.cached_tiers(k) for k in keys)
        e.settle()
        assert cache.match(keys)[0] == 0
        st = cache.stats()
        assert st.g2.free == st.g2.capacity and st.g3.free == st.g3.capacity
        assert e.sched.reset_prefix_cache()
        b = e.add("B", prompt)
        e.run()
        e.settle()
        assert [bytes(h) for h in b.block_hashes[:3]] == keys
        assert cache.stats().onboarded == 0, "nothing was left to load"
        assert cache.match(keys)[0] == 3, "stored anew"
    finally:
        e.close()


def test_an_async_load_into_a_finished_requests_blocks_waits_for_its_stores():
    # B's async load is recorded in a step that does not schedule B (it
    # waits for the KV): the blocks it writes, A's a moment ago, are named
    # all the same, and A's stores read them first.
    e = Engine({"g2_blocks": 32, "load_mode": "async"}, num_blocks=5)
    try:
        w = e.worker._worker
        p_prompt = list(range(100, 100 + 3 * BLOCK + 1))
        e.add("P", p_prompt)
        e.run()
        e.settle()
        assert e.sched.reset_prefix_cache()
        w.worker = _SlowStores(w.worker)
        a_prompt = list(range(4000, 4000 + 3 * BLOCK + 1))
        a = e.add("A", a_prompt)
        while "A" not in e.finished:
            e.step()
        a_ids = set().union(*(st.ids for st in w._stores))
        e.add("B", p_prompt)
        so, _ = e.step()
        loads = so.kv_connector_metadata.loads
        assert len(loads) == 1 and loads[0].is_async and set(loads[0].block_ids) & a_ids
        assert not any("A" in st.reqs for st in w._stores), "A's stores were waited for"
        _c_loads_as_bytes(e, a, a_prompt)
    finally:
        e.close()
