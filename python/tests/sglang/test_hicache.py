"""KvbmHiCacheStorage with the real sglang 0.5.23: built by SGLang's own
backend factory over SGLang's own host KV pool, driven by SGLang's own
HiCacheController storage methods; every page's bytes checked."""
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_harness import require_sglang

require_sglang()

import torch  # noqa: E402

from hicache_harness import (PAGE, Recorder, backup, controller, create_backend,  # noqa: E402
                             fill_pages, host_pool, kvbm_extra, pages_of, prefetch)

PYTHON_DIR = str(Path(__file__).resolve().parents[2])


def tokens(n_pages, base=0):
    return [base + i for i in range(n_pages * PAGE)]


def assert_pages_equal(got, want, what=""):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g.view(torch.int16), w.view(torch.int16)), f"{what} page {i}"


@pytest.fixture
def close_after():
    made = []
    yield made.append
    for b in made:
        b.close()


def test_import_loads_neither_sglang_nor_the_library():
    """Both adapters (HiCache storage, PD transfer backend) and the plugin."""
    code = (
        "import sys\n"
        "def lib_loaded():\n"
        "    return 'libkvbm' in open('/proc/self/maps').read()\n"
        "import kvbmgo.sglang as m, kvbmgo.sglang.plugin\n"
        "assert 'sglang' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n"
        "assert not lib_loaded()\n"
        "cls = m.KvbmHiCacheStorage\n"
        "from sglang.srt.mem_cache.hicache_storage import HiCacheStorage\n"
        "assert issubclass(cls, HiCacheStorage)\n"
        "from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVReceiver\n"
        "assert issubclass(m.KvbmKVManager, CommonKVManager)\n"
        "assert issubclass(m.KvbmKVReceiver, CommonKVReceiver)\n"
        "assert not lib_loaded(), 'building the classes loads no library'\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct", "layer_first"])
def test_v1_controller_order_and_bytes(tmp_path, close_after, layout):
    host = host_pool(layout)
    b = create_backend(host, kvbm_extra(v1=True, disk_dir=str(tmp_path / "g3"), g3_pages=64))
    close_after(b)
    assert type(b).__name__ == "KvbmHiCacheStorage" and b.layout.layout == layout
    rec = Recorder(b)
    ctl = controller(b, host)
    n = 6
    src = host.alloc(n * PAGE)
    fill_pages(host, src, seed=1)
    want = pages_of(host, src)
    toks = tokens(n)
    # Nothing stored yet: the hit query finds nothing.
    assert prefetch(ctl, host, toks) == (None, 0)
    keys, written = backup(ctl, src, toks)
    assert written == n * PAGE
    # The same prompt again, into other host pages: all of it from storage.
    dst, loaded = prefetch(ctl, host, toks)
    assert loaded == n
    assert not set(dst.tolist()) & set(src.tolist())
    assert_pages_equal(pages_of(host, dst), want, layout)
    assert rec.names() == ["batch_exists", "batch_set_v1", "batch_exists", "batch_get_v1"]
    assert all(v1 for name, _, v1 in rec.calls if name.endswith("_v1")), "host_indices passed"
    # A longer prompt sharing the prefix: the hit is the shared pages.
    assert b.batch_exists(keys + ["f" * 64]) == n
    st = b._worker.cache.stats()
    assert (st.offloaded, st.onboarded) == (n, n)


def _wait_g4_puts(backend, n):
    import time
    for _ in range(500):  # the write-through to G4 runs in the background
        if backend._worker.cache.stats().g4_puts >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"{n} pages not written to G4: {backend._worker.cache.stats()}")


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
@pytest.mark.parametrize("layout", ["page_first", "page_first_direct", "layer_first"])
def test_v1_pages_are_sglangs_flat_pages(tmp_path, close_after, layout, mla):
    """A page stored from the host pool without copies (v1) holds exactly
    SGLang's flat data page of that layout: a copying backend over the same
    object store reads it back as get_data_page(flat=True) gave it, and the
    other way round."""
    extra = dict(object_dir=str(tmp_path / "g4"), g4_mode="write-through")
    host_a, host_b = host_pool(layout, mla=mla), host_pool(layout, mla=mla)
    a = create_backend(host_a, kvbm_extra(v1=True, **extra), mla=mla)
    b = create_backend(host_b, kvbm_extra(v1=False, **extra), mla=mla)
    assert a.layout.mla == mla
    close_after(a)
    close_after(b)
    idx = host_a.alloc(3 * PAGE)
    fill_pages(host_a, idx, seed=7)
    want = pages_of(host_a, idx)
    assert a.batch_set_v1(["x0", "x1", "x2"], idx) == [True] * 3
    _wait_g4_puts(a, 3)
    got = b.batch_get(["x0", "x1", "x2"])
    assert_pages_equal(got, want, f"{layout} v1 -> flat")
    assert b.batch_set(["y0"], [want[2]]) is True
    _wait_g4_puts(b, 1)
    dst = host_a.alloc(PAGE)
    assert a.batch_get_v1(["y0"], dst) == [True]
    assert_pages_equal(pages_of(host_a, dst), [want[2]], f"{layout} flat -> v1")


def test_generic_path_through_the_controller(tmp_path, close_after):
    host = host_pool("page_first")
    b = create_backend(host, kvbm_extra(v1=False, staging_pages=4))  # fewer than a batch
    close_after(b)
    rec = Recorder(b)
    ctl = controller(b, host)
    n = 9
    src = host.alloc(n * PAGE)
    fill_pages(host, src, seed=2)
    want = pages_of(host, src)
    toks = tokens(n, base=1000)
    keys, written = backup(ctl, src, toks)
    assert written == n * PAGE
    dst, loaded = prefetch(ctl, host, toks)
    assert loaded == n
    assert_pages_equal(pages_of(host, dst), want, "generic")
    assert rec.names() == ["batch_set", "batch_exists", "batch_get"]
    # The single-key calls.
    assert b.exists(keys[0]) and not b.exists("0" * 64)
    page = b.get(keys[3])
    assert_pages_equal([page], [want[3]])
    target = host.get_dummy_flat_data_page()
    assert b.get(keys[4], target) is target
    assert_pages_equal([target], [want[4]])
    assert b.get("0" * 64) is None
    assert b.set("extra-key", want[0]) and b.exists("extra-key")
    assert b.batch_get(["0" * 64, keys[1]]) [0] is None
    # The zero-copy calls need the host pool registered: refused, not faked.
    assert b.batch_get_v1(keys[:2], dst[:2 * PAGE]) == [False, False]


def test_v1_backend_refuses_the_copying_calls(close_after):
    host = host_pool("page_first")
    b = create_backend(host, kvbm_extra(v1=True))
    close_after(b)
    idx = host.alloc(2 * PAGE)
    assert b.batch_set_v1(["a", "b"], idx) == [True, True]
    assert b.exists("a") and b.batch_exists(["a", "b", "c"]) == 2
    assert b.get("a") is None, "no staging area under interface_v1"
    assert b.set("c", host.get_data_page(idx[0], flat=True)) is False


def test_eviction_from_g2_to_g3(tmp_path, close_after):
    host = host_pool("page_first", device_pages=16)
    b = create_backend(host, kvbm_extra(v1=True, g2_pages=4, disk_dir=str(tmp_path / "g3"),
                                        g3_pages=32))
    close_after(b)
    ctl = controller(b, host)
    n = 10
    src = host.alloc(n * PAGE)
    fill_pages(host, src, seed=3)
    want = pages_of(host, src)
    toks = tokens(n, base=5000)
    keys, written = backup(ctl, src, toks)
    assert written == n * PAGE
    st = b._worker.cache.stats()
    assert st.g2.capacity == 4 and st.g2.evictions >= n - 4
    assert st.written_down >= n - 4
    host.kv_buffer.zero_()
    dst, loaded = prefetch(ctl, host, toks)
    assert loaded == n
    assert_pages_equal(pages_of(host, dst), want, "after eviction")
    st = b._worker.cache.stats()
    assert st.onboarded_from_g3 >= n - 4 and st.onboarded == n


def _files_under(directory):
    """The files under directory: those with a name, and those this process
    holds open there without one (G3 files are unnamed: /proc/self/fd/N)."""
    out = [str(p) for p in Path(directory).rglob("*") if p.is_file()]
    seen = set()
    prefix = str(directory) + "/"
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix) and target.endswith(" (deleted)") and target not in seen:
            seen.add(target)
            out.append(f"/proc/self/fd/{fd}")
    return out


def _corrupt_one(directory, page_bytes):
    """Flips a byte of page_bytes wherever it was written under directory."""
    needle = page_bytes[: 64]
    for path in _files_under(directory):
        with open(path, "r+b") as f:
            data = f.read()
            at = data.find(needle)
            if at >= 0:
                f.seek(at + 5)
                f.write(bytes([data[at + 5] ^ 0xFF]))
                return path
    return None


def test_a_corrupt_page_is_reported_false(tmp_path, close_after):
    host = host_pool("page_first")
    g3 = tmp_path / "g3"
    b = create_backend(host, kvbm_extra(v1=True, g2_pages=2, disk_dir=str(g3), g3_pages=16))
    close_after(b)
    n = 6
    src = host.alloc(n * PAGE)
    fill_pages(host, src, seed=4)
    want = pages_of(host, src)
    keys = [f"{i:064x}" for i in range(1, n + 1)]
    assert b.batch_set_v1(keys, src) == [True] * n
    # Pages 0..3 were evicted from the 2-page G2 to G3; corrupt page 1 there.
    assert _corrupt_one(g3, want[1].view(torch.uint8).numpy().tobytes()) is not None
    host.kv_buffer.zero_()
    res = b.batch_get_v1(keys, src)
    assert res == [True, False, True, True, True, True]
    got = pages_of(host, src)
    assert_pages_equal([got[i] for i in (0, 2, 3, 4, 5)], [want[i] for i in (0, 2, 3, 4, 5)])
    # The corrupt page is gone: the prefix ends before it.
    assert b.batch_exists(keys) == 1
    assert b._worker.cache.stats().g3.removed == 1


def test_missing_and_misaligned_pages_are_false(close_after):
    host = host_pool("page_first")
    b = create_backend(host, kvbm_extra(v1=True))
    close_after(b)
    idx = host.alloc(3 * PAGE)
    assert b.batch_set_v1(["k0", "k1"], idx[:2 * PAGE]) == [True, True]
    assert b.batch_get_v1(["k0", "nope", "k1"], idx) == [True, False, True]
    bad = idx[:2 * PAGE].clone()
    bad[PAGE:] += 1  # the second key's slots straddle two pages
    assert b.batch_set_v1(["k2", "k3"], bad) == [True, False]
    assert b.batch_exists(["k2", "k3"]) == 1
    assert b.batch_get_v1([], idx[:0]) == [] and b.batch_set_v1([], idx[:0]) == []


def test_clear_hides_what_was_stored(close_after):
    host = host_pool("page_first")
    b = create_backend(host, kvbm_extra(v1=True))
    close_after(b)
    idx = host.alloc(2 * PAGE)
    assert b.batch_set_v1(["c0", "c1"], idx) == [True, True]
    b.clear()
    assert b.batch_exists(["c0", "c1"]) == 0
    assert b.batch_get_v1(["c0", "c1"], idx) == [False, False]
    st = b._worker.cache.stats()
    assert st.g2.free == st.g2.capacity, "G2 dropped the pages"
    assert b.batch_set_v1(["c0"], idx[:PAGE]) == [True] and b.exists("c0")


def test_repeated_keys_in_one_batch(close_after):
    host = host_pool("page_first")
    b = create_backend(host, kvbm_extra(v1=True))
    close_after(b)
    idx = host.alloc(3 * PAGE)
    fill_pages(host, idx, seed=5)
    want = pages_of(host, idx)
    assert b.batch_set_v1(["a", "b", "a"], idx) == [True, True, True]
    dst = host.alloc(3 * PAGE)
    assert b.batch_get_v1(["a", "a", "b"], dst) == [True, True, True]
    assert_pages_equal(pages_of(host, dst), [want[0], want[0], want[1]])
    assert b.batch_exists(["a", "b", "a", "b"]) == 2


def test_ranks_and_models_have_their_own_keys(tmp_path, close_after):
    """Five backends share one object store (G4): only the same model on the
    same tensor and data-parallel rank finds the pages."""
    g4 = str(tmp_path / "g4")
    host = host_pool("page_first")
    extra = kvbm_extra(v1=True, object_dir=g4, g4_mode="write-through")
    a = create_backend(host, extra, tp_rank=0, tp_size=2)
    close_after(a)
    idx = host.alloc(2 * PAGE)
    fill_pages(host, idx, seed=6)
    want = pages_of(host, idx)
    assert a.batch_set_v1(["p0", "p1"], idx) == [True, True]
    _wait_g4_puts(a, 2)
    same = create_backend(host_pool("page_first"), extra, tp_rank=0, tp_size=2)
    other_rank = create_backend(host_pool("page_first"), extra, tp_rank=1, tp_size=2)
    other_model = create_backend(host_pool("page_first"), extra, tp_rank=0, tp_size=2,
                                 model="other")
    other_dp = create_backend(host_pool("page_first"), extra, tp_rank=0, tp_size=2, dp_rank=1)
    for x in (same, other_rank, other_model, other_dp):
        close_after(x)
    assert same.batch_exists(["p0", "p1"]) == 2
    assert other_dp.batch_exists(["p0", "p1"]) == 0
    assert other_rank.batch_exists(["p0", "p1"]) == 0
    assert other_model.batch_exists(["p0", "p1"]) == 0
    h = same.mem_pool_host
    dst = h.alloc(2 * PAGE)
    assert same.batch_get_v1(["p0", "p1"], dst) == [True, True]
    assert_pages_equal(pages_of(h, dst), want, "from G4")


def test_mla_ranks_share_their_pages(tmp_path, close_after):
    """MLA KV is the same on every tensor rank: rank 1 finds rank 0's pages
    in the shared object store."""
    extra = kvbm_extra(v1=True, object_dir=str(tmp_path / "g4"), g4_mode="write-through")
    r0 = create_backend(host_pool("page_first", mla=True), extra, tp_rank=0, tp_size=2, mla=True)
    r1 = create_backend(host_pool("page_first", mla=True), extra, tp_rank=1, tp_size=2, mla=True)
    close_after(r0)
    close_after(r1)
    h0, h1 = r0.mem_pool_host, r1.mem_pool_host
    idx = h0.alloc(2 * PAGE)
    fill_pages(h0, idx, seed=8)
    assert r0.batch_set_v1(["m0", "m1"], idx) == [True, True]
    _wait_g4_puts(r0, 2)
    dst = h1.alloc(2 * PAGE)
    assert r1.batch_exists(["m0", "m1"]) == 2
    assert r1.batch_get_v1(["m0", "m1"], dst) == [True, True]
    assert_pages_equal(pages_of(h1, dst), pages_of(h0, idx), "MLA rank 0 -> rank 1")


def test_refusals(tmp_path):
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    from hicache_harness import storage_config
    with pytest.raises(ValueError, match="unknown extra_config key 'g2_page'"):
        StorageBackendFactory.create_backend("dynamic", storage_config(kvbm_extra(g2_page=4)),
                                             None)
    with pytest.raises(ValueError, match="disk_dir needs g3_pages"):
        StorageBackendFactory.create_backend(
            "dynamic", storage_config(kvbm_extra(disk_dir=str(tmp_path))), None)
    host = host_pool("page_head")
    b = StorageBackendFactory.create_backend("dynamic", storage_config(kvbm_extra()), host)
    with pytest.raises(ValueError, match="'page_head' is not supported"):
        b.register_mem_pool_host(host)
    # Before a host pool is registered nothing is stored or found.
    assert b.batch_set_v1(["a"], torch.arange(PAGE)) == [False]
    assert b.batch_exists(["a"]) == 0 and b.get("a") is None


def test_prefetch_and_backup_threads_at_once(tmp_path, close_after):
    """SGLang's backup and prefetch threads call the backend concurrently:
    a page reported loaded holds its bytes, and every page is found in the
    end (G2 holds 24 of the 60 pages: the rest go through G3)."""
    import threading
    import time
    host = host_pool("page_first", device_pages=32)
    b = create_backend(host, kvbm_extra(v1=True, g2_pages=24, disk_dir=str(tmp_path / "g3"),
                                        g3_pages=128))
    close_after(b)
    errors, loaded = [], []
    slots = [(host.alloc(4 * PAGE), host.alloc(4 * PAGE)) for _ in range(3)]

    def run(t):
        try:
            src, dst = slots[t]
            for r in range(5):
                keys = [f"t{t}-r{r}-{i}" for i in range(4)]
                fill_pages(host, src, seed=100 * t + r)
                want = pages_of(host, src)
                assert b.batch_set_v1(keys, src) == [True] * 4
                host.kv_buffer[:, dst[0]:dst[-1] + 1].zero_()
                ok = b.batch_get_v1(keys, dst)
                got = pages_of(host, dst)
                for i in range(4):
                    if ok[i]:  # a page reported loaded holds its bytes
                        assert_pages_equal([got[i]], [want[i]], f"thread {t} round {r} page {i}")
                loaded.append(sum(ok))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert sum(loaded) > 0
    keys = [f"t{t}-r{r}-{i}" for t in range(3) for r in range(5) for i in range(4)]
    for _ in range(200):  # write-downs to G3 may still be landing
        if all(b.exists(k) for k in keys):
            break
        time.sleep(0.01)
    assert all(b.exists(k) for k in keys)


def test_storage_metrics_through_sglangs_collector(close_after):
    # What --enable-storage-metrics shows: SGLang's StorageMetricsCollector
    # logs get_stats() into the real prometheus_client registry.
    from prometheus_client import REGISTRY
    from sglang.srt.observability.metrics_collector import StorageMetricsCollector
    host = host_pool("page_first")
    b = create_backend(host, kvbm_extra(v1=True))
    close_after(b)
    assert b.get_stats().prefetch_pgs == []  # nothing moved yet
    ctl = controller(b, host)
    n = 5
    src = host.alloc(n * PAGE)
    fill_pages(host, src, seed=3)
    toks = tokens(n, base=9000)
    backup(ctl, src, toks)
    _, loaded = prefetch(ctl, host, toks)
    assert loaded == n
    labels = {"storage_backend": "kvbm"}
    collector = StorageMetricsCollector(labels)
    collector.log_storage_metrics(b.get_stats())

    def sample(name):
        return REGISTRY.get_sample_value(name, labels)
    assert sample("sglang:backup_pgs_count") == 1 and sample("sglang:backup_pgs_sum") == n
    assert sample("sglang:prefetch_pgs_count") == 1 and sample("sglang:prefetch_pgs_sum") == n
    assert sample("sglang:prefetch_bandwidth_count") == 1
    assert sample("sglang:backup_bandwidth_sum") > 0
    # Taken: the next call reports only what moved since.
    assert b.get_stats().backup_pgs == []


def test_a_hit_query_answers_only_what_is_worth_loading(close_after):
    """prefill_tokens_per_s set: batch_exists asks kvbm's load policy
    (kvbm_load_plan) with the cache's measured load rates: pages on a tier
    measured slower than recomputing are no hit, on a fast one they are;
    before anything was measured every page held is."""
    import dataclasses
    from kvbmgo import CacheStats
    host = host_pool("page_first")
    b = create_backend(host, kvbm_extra(v1=True, prefill_tokens_per_s=1e6))
    close_after(b)
    ctl = controller(b, host)
    n = 4
    src = host.alloc(n * PAGE)
    fill_pages(host, src, seed=3)
    keys, _ = backup(ctl, src, tokens(n, base=500))
    assert b.batch_exists(keys) == n  # nothing measured yet
    cache = b._worker.cache
    real = type(cache).stats

    def measured(g2_rate):
        def stats(self):
            return dataclasses.replace(real(self), load_rate=(0.0, 0.0, g2_rate, 0.0, 0.0))
        return stats
    try:
        type(cache).stats = measured(1e3)   # 1 kB/s against a million tokens a second
        assert b.batch_exists(keys) == 0
        type(cache).stats = measured(50e9)
        assert b.batch_exists(keys) == n
    finally:
        type(cache).stats = real
    assert isinstance(cache.stats(), CacheStats)


def test_the_prefill_rate_is_learned_from_misses_and_their_backups(close_after):
    """No prefill_tokens_per_s: a hit query that misses starts a clock for
    the pages SGLang will compute, their backup stops it; from then on
    batch_exists asks the load policy (auto, the default) with that rate,
    and "load_policy": "always" never does."""
    import dataclasses
    import time
    host = host_pool("page_first")
    b = create_backend(host, kvbm_extra(v1=True))
    close_after(b)
    n = 4
    src = host.alloc(n * PAGE)
    fill_pages(host, src, seed=5)
    keys = [f"learn-{i}" for i in range(n)]
    assert b.batch_exists(keys) == 0  # a miss: SGLang computes these pages
    assert b._prefill.tokens_per_s() == 0
    time.sleep(0.2)
    assert all(b.batch_set_v1(keys, src))  # and backs them up
    rate = b._prefill.tokens_per_s()
    assert 0 < rate <= n * PAGE / 0.2, rate
    cache = b._worker.cache
    real = type(cache).stats

    def measured(g2_rate):
        def stats(self):
            return dataclasses.replace(real(self), load_rate=(0.0, 0.0, g2_rate, 0.0, 0.0))
        return stats
    try:
        type(cache).stats = measured(1.0)  # a byte a second: recomputing wins
        assert b.batch_exists(keys) == 0
        type(cache).stats = measured(50e9)
        assert b.batch_exists(keys) == n
        type(cache).stats = measured(1.0)
        b.config = dataclasses.replace(b.config, load_policy="always")
        assert b.batch_exists(keys) == n
    finally:
        type(cache).stats = real


def test_a_g2_below_sglangs_backup_batch_is_warned_about(caplog):
    host = host_pool("page_first", device_pages=16)
    with caplog.at_level(logging.WARNING, logger="kvbmgo.sglang.hicache"):
        for g2 in (4, 128, None):  # one after another: each registers the host pool
            extra = kvbm_extra(v1=True, **({} if g2 is None else {"g2_pages": g2}))
            create_backend(host, extra).close()
    warned = [r.getMessage() for r in caplog.records if "backup batch" in r.getMessage()]
    assert len(warned) == 1 and "g2_pages=4 " in warned[0], warned
