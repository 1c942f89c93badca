"""KvbmHiCacheStorage's v2 calls (hybrid models) with the real sglang 0.5.23:
SGLang's own host pools (KV, Mamba states, the SWA layers' KV), driven by
its own HybridCacheController storage methods; every page's bytes checked
against what was stored under its key, each hit policy at its edge."""
import logging
import time
from types import SimpleNamespace

import pytest

from hicache_harness import require_sglang

require_sglang()

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName  # noqa: E402

from hicache_harness import PAGE, create_backend, host_pool, kvbm_extra  # noqa: E402
from hybrid_harness import (ByteCheck, backup, fill, hit_query, hybrid_controller,  # noqa: E402
                            keys_of, mamba_pool, page_bytes, swa_pool, transfer)

N = 6  # pages of the prompt; two radix nodes of 3 pages each


@pytest.fixture
def close_after():
    made = []
    yield made.append
    for b in made:
        b.close()


def hybrid(close_after, pools, extra=None, **cfg):
    """A backend attached as HybridCacheController.attach_storage_backend
    does it: the anchor (KV) pool, then every pool through v2, then
    on_host_pools_registered. Returns the backend and SGLang's controller."""
    kv = pools[PoolName.KV]
    b = create_backend(kv, extra or kvbm_extra(v1=True), **cfg)
    close_after(b)
    for name, pool in pools.items():
        b.register_mem_host_pool_v2(pool, name)
    b.on_host_pools_registered()
    return b, hybrid_controller(b, kv, pools)


def prompt(kv, seed=0):
    toks = list(range(seed * 1000, seed * 1000 + N * PAGE))
    src = kv.alloc(N * PAGE)
    for i in range(N):
        fill(kv, int(src[i * PAGE]), seed * 100 + i)
    return toks, keys_of(toks), src


def kv_pages_equal(kv, a, b, n):
    return all(torch.equal(page_bytes(kv, int(a[i * PAGE])), page_bytes(kv, int(b[i * PAGE])))
               for i in range(n))


def drain(ctl):
    acks = []
    while not ctl.prefetch_sync_queue.empty():
        acks.append(ctl.prefetch_sync_queue.get())
    return acks


def backup_node(ctl, src, toks, keys, first, last, transfers):
    """Backs up pages [first, last) as one radix node (prefix keys before it)."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import StorageOperation
    op = StorageOperation(src[first * PAGE:last * PAGE], toks[first * PAGE:last * PAGE],
                          hash_value=keys[first:last], prefix_keys=keys[:first] or None,
                          pool_transfers=list(transfers) or None)
    ctl._page_backup_or_log(op)
    return op


# ---- KV + Mamba


@pytest.mark.parametrize("side_state", [False, True], ids=["mamba", "mamba+side-state"])
def test_kv_mamba_round_trip_through_the_controller(close_after, side_state):
    """Two nodes, each with its Mamba state at its end: the hit query sees
    both boundaries, the controller loads the KV pages (v1) and the state
    at the hit's end (v2), every byte as stored under its key."""
    kv, m = host_pool("page_first_direct"), mamba_pool(side_state=side_state)
    b, ctl = hybrid(close_after, {PoolName.KV: kv, PoolName.MAMBA: m})
    store = b._pools["mamba"]
    assert len(store.parts) == (3 if side_state else 2)  # rows of 256, 192 (and 24) bytes
    check = ByteCheck(b, {"kv": kv, "mamba": m})
    toks, keys, src = prompt(kv)
    s1, s2 = m.alloc(1), m.alloc(1)
    fill(m, int(s1[0]), 1)
    fill(m, int(s2[0]), 2)
    for first, last, slot in ((0, 3, s1), (3, 6, s2)):
        op = backup_node(ctl, src, toks, keys, first, last,
                         [transfer(PoolName.MAMBA, [keys[last - 1]], slot)])
        assert op.completed_tokens == 3 * PAGE
        assert op.pool_storage_result.extra_pool_hit_pages == {PoolName.MAMBA: 1}

    op, hit = hit_query(ctl, toks, [transfer(PoolName.MAMBA, ["__placeholder__"])])
    assert hit == N * PAGE
    assert op.pool_storage_result.restorable_prefix_pages == [3, 6]
    assert op.query_pool_hit_pages == {PoolName.KV: N, PoolName.MAMBA: N}

    op.host_indices = kv.alloc(hit)
    dst = m.alloc(1)
    op.pool_transfers[0].host_indices = dst
    ctl._page_transfer(op)
    acks = drain(ctl)
    assert acks[0].completed_tokens == N * PAGE
    assert acks[-1].pool_hits == {PoolName.MAMBA: 1}
    assert op.pool_transfers[0].keys == [keys[5]]  # SGLang re-aligned it to the hit's end
    assert kv_pages_equal(kv, src, op.host_indices, N)
    assert torch.equal(page_bytes(m, int(dst[0])), page_bytes(m, int(s2[0])))
    assert check.loaded == 1 and check.mismatches == []


def test_a_missing_trailing_state_shrinks_the_prefix(close_after):
    """KV for 6 pages, a Mamba state only at page 3: the usable prefix is 3
    pages (the last restorable one), and the controller loads page 3's
    state; with no state at all nothing is restorable."""
    kv, m = host_pool("page_first_direct"), mamba_pool()
    b, ctl = hybrid(close_after, {PoolName.KV: kv, PoolName.MAMBA: m})
    check = ByteCheck(b, {"kv": kv, "mamba": m})
    toks, keys, src = prompt(kv)
    s1 = m.alloc(1)
    fill(m, int(s1[0]), 7)
    backup_node(ctl, src, toks, keys, 0, 3, [transfer(PoolName.MAMBA, [keys[2]], s1)])
    backup_node(ctl, src, toks, keys, 3, 6, [])  # the node's state was never backed up
    assert b.batch_exists(keys) == N

    want = [transfer(PoolName.MAMBA, ["__placeholder__"])]
    r = b.batch_exists_v2(keys, want)
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (3, [3])
    assert r.extra_pool_hit_pages == {PoolName.KV: N, PoolName.MAMBA: 3}
    r = b.batch_exists_v2(keys[:2], want)  # before the first state: nothing
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (0, [])

    op, hit = hit_query(ctl, toks, want)
    assert hit == 3 * PAGE
    op.host_indices = kv.alloc(hit)
    dst = m.alloc(1)
    op.pool_transfers[0].host_indices = dst
    ctl._page_transfer(op)
    assert drain(ctl)[-1].pool_hits == {PoolName.MAMBA: 1}
    assert op.pool_transfers[0].keys == [keys[2]]
    assert kv_pages_equal(kv, src, op.host_indices, 3)
    assert torch.equal(page_bytes(m, int(dst[0])), page_bytes(m, int(s1[0])))
    assert check.loaded == 1 and check.mismatches == []

    other_toks, other_keys, other_src = prompt(kv, seed=1)
    backup_node(ctl, other_src, other_toks, other_keys, 0, 6, [])
    r = b.batch_exists_v2(other_keys, want)
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (0, [])
    assert r.extra_pool_hit_pages == {PoolName.KV: N, PoolName.MAMBA: 0}


def test_a_stale_mamba_state_under_the_right_key_is_caught_by_the_byte_check(close_after):
    """The break: a save that stores an older state (the slot of the node
    before) under the new node's key. Tokens could not tell; the byte check
    does, and the same run without the break passes it."""
    for broken in (False, True):
        kv, m = host_pool("page_first_direct"), mamba_pool()
        b, ctl = hybrid(close_after, {PoolName.KV: kv, PoolName.MAMBA: m})
        check = ByteCheck(b, {"kv": kv, "mamba": m})
        toks, keys, src = prompt(kv)
        old, new = m.alloc(1), m.alloc(1)
        fill(m, int(old[0]), 11)
        fill(m, int(new[0]), 12)
        backup_node(ctl, src, toks, keys, 0, 3, [transfer(PoolName.MAMBA, [keys[2]], old)])
        store = b._pools["mamba"]
        if broken:
            real = store.save
            store.save = lambda ns, ks, pages: real(ns, ks, [int(old[0])] * len(pages))
        backup_node(ctl, src, toks, keys, 3, 6, [transfer(PoolName.MAMBA, [keys[5]], new)])
        op, hit = hit_query(ctl, toks, [transfer(PoolName.MAMBA, ["__placeholder__"])])
        assert hit == N * PAGE
        op.host_indices = kv.alloc(hit)
        op.pool_transfers[0].host_indices = m.alloc(1)
        ctl._page_transfer(op)
        drain(ctl)
        assert check.loaded == 1
        assert check.mismatches == ([("mamba", keys[5])] if broken else [])


# ---- KV + SWA (a window of 2 pages)


def test_kv_swa_window_round_trip_and_its_edge(close_after):
    """SWA keeps the last 2 pages of each node: prefixes of 3 and 6 pages
    are restorable; the controller loads the window at the hit's end. With
    one page of the last window missing, the prefix shrinks to 3."""
    kv, swa = host_pool("page_first_direct"), swa_pool()
    b, ctl = hybrid(close_after, {PoolName.KV: kv, PoolName.SWA: swa})
    assert b._pools["swa"].layout.page_size == PAGE
    check = ByteCheck(b, {"kv": kv, "swa": swa})
    toks, keys, src = prompt(kv)
    windows = []
    for first, last in ((0, 3), (3, 6)):
        w = swa.alloc(2 * PAGE)
        for i in range(2):
            fill(swa, int(w[i * PAGE]), 50 + last + i)
        windows.append(w)
        op = backup_node(ctl, src, toks, keys, first, last,
                         [transfer(PoolName.SWA, keys[last - 2:last], w)])
        assert op.pool_storage_result.extra_pool_hit_pages == {PoolName.SWA: 2}

    want = [transfer(PoolName.SWA, ["__placeholder__"] * 2)]
    r = b.batch_exists_v2(keys, want)
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (6, [3, 6])
    r = b.batch_exists_v2(keys, [transfer(PoolName.SWA, ["__placeholder__"] * 3)])
    assert r.restorable_prefix_pages == []  # no window of 3 pages was kept

    op, hit = hit_query(ctl, toks, want)
    assert hit == N * PAGE
    op.host_indices = kv.alloc(hit)
    dst = swa.alloc(2 * PAGE)
    op.pool_transfers[0].host_indices = dst
    ctl._page_transfer(op)
    assert drain(ctl)[-1].pool_hits == {PoolName.SWA: 2}
    assert op.pool_transfers[0].keys == keys[4:6]
    assert kv_pages_equal(kv, src, op.host_indices, N)
    assert kv_pages_equal(swa, windows[1], dst, 2)
    assert check.loaded == 2 and check.mismatches == []

    # The edge: another prompt whose second window kept only its last page.
    toks2, keys2, src2 = prompt(kv, seed=2)
    w1, w2 = swa.alloc(2 * PAGE), swa.alloc(PAGE)
    backup_node(ctl, src2, toks2, keys2, 0, 3, [transfer(PoolName.SWA, keys2[1:3], w1)])
    backup_node(ctl, src2, toks2, keys2, 3, 6, [transfer(PoolName.SWA, keys2[5:6], w2)])
    r = b.batch_exists_v2(keys2, want)
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (3, [3])
    assert r.extra_pool_hit_pages[PoolName.SWA] == 3


# ---- ALL_PAGES and BLOCK_GROUPS (a KV-shaped sidecar pool)


def _sidecar(close_after):
    kv, side = host_pool("page_first_direct"), host_pool("page_first", device_pages=8)
    b, ctl = hybrid(close_after, {PoolName.KV: kv, PoolName.INDEXER: side})
    toks, keys, src = prompt(kv)
    backup_node(ctl, src, toks, keys, 0, 6, [])
    sp = side.alloc(N * PAGE)
    for i in range(N):
        fill(side, int(sp[i * PAGE]), 70 + i)
    return b, side, keys, sp


def test_an_interior_all_pages_miss_cuts_the_prefix_there(close_after):
    b, side, keys, sp = _sidecar(close_after)
    kept = [0, 1, 3, 4, 5]  # page 2 never stored
    idx = torch.cat([sp[i * PAGE:(i + 1) * PAGE] for i in kept])
    res = b.batch_set_v2([transfer(PoolName.INDEXER, [keys[i] for i in kept], idx,
                                   policy="all_pages")])
    assert res == {PoolName.INDEXER: [True] * 5}
    r = b.batch_exists_v2(keys, [transfer(PoolName.INDEXER, keys, policy="all_pages")])
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (2, [1, 2])
    assert r.extra_pool_hit_pages == {PoolName.KV: N, PoolName.INDEXER: 2}
    # the missing page is reported False on load, the others loaded byte for byte
    dst = side.alloc(N * PAGE)
    got = b.batch_get_v2([transfer(PoolName.INDEXER, keys, dst, policy="all_pages")])
    assert got == {PoolName.INDEXER: [True, True, False, True, True, True]}
    for i in kept:
        assert torch.equal(page_bytes(side, int(dst[i * PAGE])), page_bytes(side, int(sp[i * PAGE])))


def test_block_groups_are_reported_and_never_cut(close_after):
    b, side, keys, sp = _sidecar(close_after)
    kept = [0, 1, 2, 3, 5]  # the third group of 2 is incomplete
    idx = torch.cat([sp[i * PAGE:(i + 1) * PAGE] for i in kept])
    b.batch_set_v2([transfer(PoolName.INDEXER, [keys[i] for i in kept], idx)])
    r = b.batch_exists_v2(keys, [transfer(PoolName.INDEXER, keys, policy="block_groups",
                                          block_pages=1, group_pages=2)])
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (N, list(range(1, N + 1)))
    assert r.extra_pool_hit_pages[PoolName.INDEXER] == 4


# ---- failures


def test_failures_are_per_entry(close_after):
    kv, m = host_pool("page_first_direct"), mamba_pool()
    b, _ = hybrid(close_after, {PoolName.KV: kv, PoolName.MAMBA: m})
    s = m.alloc(3)
    fill(m, int(s[0]), 1)
    assert b.batch_set_v2([transfer(PoolName.MAMBA, ["a"], s[:1])]) == {PoolName.MAMBA: [True]}
    before = page_bytes(m, int(s[2]))
    bad = torch.tensor([int(s[1]), 10_000, int(s[2])])  # a slot past the pool
    got = b.batch_get_v2([transfer(PoolName.MAMBA, ["a", "a", "never"], bad)])
    assert got == {PoolName.MAMBA: [True, False, False]}
    assert torch.equal(page_bytes(m, int(s[1])), page_bytes(m, int(s[0])))
    assert torch.equal(page_bytes(m, int(s[2])), before)
    # fewer host slots than keys: the keys without one fail
    got = b.batch_get_v2([transfer(PoolName.MAMBA, ["a", "a"], s[:1])])
    assert got == {PoolName.MAMBA: [True, False]}


def test_a_pool_kvbm_cannot_keep_is_unavailable_with_one_warning(close_after, caplog):
    """A pool without buffers kvbm can describe (here a logical pool with
    no kv_buffer), and a transfer naming a pool never registered: one
    warning each, their pages missing (hit 0, nothing restorable that
    needs them), their moves False; the KV pool works on."""
    kv = host_pool("page_first_direct")
    odd = SimpleNamespace(kv_buffer=None, page_size=1, layout="page_first_direct")
    with caplog.at_level(logging.WARNING, logger="kvbmgo.sglang.hicache"):
        b, ctl = hybrid(close_after, {PoolName.KV: kv, PoolName.MAMBA: odd})
        toks, keys, src = prompt(kv)
        op = backup_node(ctl, src, toks, keys, 0, 6,
                         [transfer(PoolName.MAMBA, [keys[5]], torch.tensor([0]))])
        assert op.pool_storage_result.extra_pool_hit_pages == {PoolName.MAMBA: 0}
        for _ in range(2):
            r = b.batch_exists_v2(keys, [transfer(PoolName.MAMBA, ["__placeholder__"])])
            assert (r.kv_hit_pages, r.restorable_prefix_pages) == (0, [])
            assert r.extra_pool_hit_pages[PoolName.MAMBA] == 0
            assert b.batch_get_v2([transfer(PoolName.MAMBA, [keys[5]], torch.tensor([0]))]) == \
                {PoolName.MAMBA: [False]}
            r = b.batch_exists_v2(keys, [transfer(PoolName.SWA, ["__placeholder__"] * 2)])
            assert (r.kv_hit_pages, r.restorable_prefix_pages) == (0, [])
    warned = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warned) == 2, warned
    assert "'mamba'" in warned[0] and "SimpleNamespace" in warned[0]
    assert "'swa'" in warned[1] and "never registered" in warned[1]
    assert b.batch_exists(keys) == N  # KV alone is still kept


# ---- tiers, stats


def test_a_fresh_backend_finds_the_states_in_g4(tmp_path, close_after):
    """A Mamba state written through to the object store (G4) is found and
    loaded byte for byte by another backend (a fresh G2, as a fresh process
    has) of the same model and rank; another rank's backend finds nothing."""
    extra = kvbm_extra(v1=True, object_dir=str(tmp_path / "g4"), g4_mode="write-through",
                       disk_dir=str(tmp_path / "g3"), g3_pages=16)
    kv, m = host_pool("page_first_direct"), mamba_pool()
    a, ctl = hybrid(close_after, {PoolName.KV: kv, PoolName.MAMBA: m}, extra)
    toks, keys, src = prompt(kv)
    s = m.alloc(1)
    fill(m, int(s[0]), 5)
    backup_node(ctl, src, toks, keys, 0, 6, [transfer(PoolName.MAMBA, [keys[5]], s)])
    # Written through in the background: wait for the KV pages' puts and
    # the state's (a loaded machine lets the query below come first).
    puts = [(a._worker.cache, N)] + [(part.worker.cache, 1) for part in a._pools["mamba"].parts]
    for cache, n in puts:
        for _ in range(1000):
            if cache.stats().g4_puts >= n:
                break
            time.sleep(0.01)
        assert cache.stats().g4_puts >= n, cache.stats()
    kv2, m2 = host_pool("page_first_direct"), mamba_pool()
    b, _ = hybrid(close_after, {PoolName.KV: kv2, PoolName.MAMBA: m2}, extra)
    other, _ = hybrid(close_after, {PoolName.KV: host_pool("page_first_direct"),
                                    PoolName.MAMBA: mamba_pool()}, extra, tp_rank=1, tp_size=2)
    want = [transfer(PoolName.MAMBA, ["__placeholder__"])]
    r = b.batch_exists_v2(keys, want)
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (N, [N])
    assert other.batch_exists_v2(keys, want).kv_hit_pages == 0
    dst = m2.alloc(1)
    assert b.batch_get_v2([transfer(PoolName.MAMBA, [keys[5]], dst)]) == {PoolName.MAMBA: [True]}
    assert torch.equal(page_bytes(m2, int(dst[0])), page_bytes(m, int(s[0])))


def test_get_stats_reports_per_pool(close_after):
    kv, m = host_pool("page_first_direct"), mamba_pool()
    b, ctl = hybrid(close_after, {PoolName.KV: kv, PoolName.MAMBA: m})
    toks, keys, src = prompt(kv)
    s = m.alloc(1)
    backup_node(ctl, src, toks, keys, 0, 6, [transfer(PoolName.MAMBA, [keys[5]], s)])
    b.batch_get_v2([transfer(PoolName.MAMBA, [keys[5]], m.alloc(1))])
    st = b.get_stats()
    assert st.backup_pgs == [N]  # SGLang's own figures: the KV pool's
    assert sorted(st.pools) == ["kv", "mamba"]
    assert st.pools["kv"].backup_pgs == [N]
    assert (st.pools["mamba"].backup_pgs, st.pools["mamba"].prefetch_pgs) == ([1], [1])
    assert len(st.pools["mamba"].backup_bandwidth) == 1
    again = b.get_stats()
    assert again.backup_pgs == [] and again.pools["mamba"].backup_pgs == []
    plain = create_backend(host_pool("page_first"), kvbm_extra(v1=True))
    close_after(plain)
    assert plain.get_stats().pools == {}  # a model without other pools: v1 alone


def test_copying_path_keeps_the_other_pools_and_pool_settings(tmp_path, close_after, caplog):
    """With "interface_v1": 0 the KV pool moves through the copying calls
    (no v2 store, no warning), the Mamba pool through v2 as ever, with the
    G2 size its settings name (more pages than G2 go down to G3 and come
    back); bad settings are refused naming the key."""
    from kvbmgo.sglang.config import KvbmHiCacheConfig
    kv, m = host_pool("page_first"), mamba_pool()
    extra = kvbm_extra(v1=False, disk_dir=str(tmp_path / "g3"), g3_pages=8,
                       pools={"mamba": {"g2_pages": 3}})
    with caplog.at_level(logging.WARNING, logger="kvbmgo.sglang.hicache"):
        b, _ = hybrid(close_after, {PoolName.KV: kv, PoolName.MAMBA: m}, extra)
    assert not [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert sorted(b._pools) == ["mamba"]
    assert {p.g2_pages for p in b._pools["mamba"].parts} == {3}
    s = m.alloc(5)
    for i in range(5):
        fill(m, int(s[i]), 30 + i)
    names = [f"s{i}" for i in range(5)]  # more pages than G2: moved in rounds
    assert b.batch_set_v2([transfer(PoolName.MAMBA, names, s)]) == {PoolName.MAMBA: [True] * 5}
    dst = m.alloc(5)
    assert b.batch_get_v2([transfer(PoolName.MAMBA, names, dst)]) == {PoolName.MAMBA: [True] * 5}
    for i in range(5):
        assert torch.equal(page_bytes(m, int(dst[i])), page_bytes(m, int(s[i])))
    for bad in ({"mamba": {"g2": 1}}, {"mamba": {"g2_pages": 0}}, ["mamba"]):
        with pytest.raises(ValueError, match="pools"):
            KvbmHiCacheConfig.from_extra_config({"pools": bad})


def test_a_pool_with_bytes_outside_its_buffers_is_unavailable(close_after, caplog):
    """A pool whose page holds more bytes than the buffers kvbm sees (as an
    MXFP8 pool's scales) is refused, not stored in part."""
    kv, swa = host_pool("page_first_direct"), swa_pool()
    real = swa.get_size_per_token
    swa.get_size_per_token = lambda: real() + 2
    with caplog.at_level(logging.WARNING, logger="kvbmgo.sglang.hicache"):
        b, _ = hybrid(close_after, {PoolName.KV: kv, PoolName.SWA: swa})
    assert "swa" not in b._pools and "kv" in b._pools
    warned = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warned) == 1 and "'swa'" in warned[0] and "bytes a page" in warned[0]


def test_prefetch_and_backup_threads_at_once(close_after):
    """SGLang's backup and prefetch threads call v2 at once: states saved by
    one while the other queries and loads earlier ones, every byte right."""
    import threading
    kv, m = host_pool("page_first_direct"), mamba_pool(slots=32)
    b, _ = hybrid(close_after, {PoolName.KV: kv, PoolName.MAMBA: m})
    check = ByteCheck(b, {"kv": kv, "mamba": m})
    first = m.alloc(8)
    for i in range(8):
        fill(m, int(first[i]), 200 + i)
    assert b.batch_set_v2([transfer(PoolName.MAMBA, [f"a{i}" for i in range(8)], first)]) == \
        {PoolName.MAMBA: [True] * 8}
    later = m.alloc(8)
    for i in range(8):
        fill(m, int(later[i]), 300 + i)
    dst = m.alloc(8)
    errors = []

    def saver():
        for i in range(8):
            r = b.batch_set_v2([transfer(PoolName.MAMBA, [f"b{i}"], later[i:i + 1])])
            if r != {PoolName.MAMBA: [True]}:
                errors.append(("set", i, r))

    def loader():
        for i in range(8):
            r = b.batch_get_v2([transfer(PoolName.MAMBA, [f"a{i}"], dst[i:i + 1])])
            if r != {PoolName.MAMBA: [True]}:
                errors.append(("get", i, r))

    threads = [threading.Thread(target=saver), threading.Thread(target=loader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert check.loaded == 8 and check.mismatches == []
    back = m.alloc(8)
    got = b.batch_get_v2([transfer(PoolName.MAMBA, [f"b{i}" for i in range(8)], back)])
    assert got == {PoolName.MAMBA: [True] * 8} and check.mismatches == []


def test_the_load_policy_cuts_the_kv_run_before_the_pools(close_after):
    """batch_exists_v2 answers as far as loading the KV pages is worth it
    (load_policy auto, the prefill rate learned from a miss and its backup):
    a KV tier measured slower than recomputing restores nothing, whatever
    the state pools hold."""
    import dataclasses
    kv, m = host_pool("page_first_direct"), mamba_pool()
    b, ctl = hybrid(close_after, {PoolName.KV: kv, PoolName.MAMBA: m})
    toks, keys, src = prompt(kv)
    want = [transfer(PoolName.MAMBA, ["__placeholder__"])]
    assert b.batch_exists_v2(keys, want).kv_hit_pages == 0  # a miss: the clock starts
    time.sleep(0.1)
    s1 = m.alloc(1)
    fill(m, int(s1[0]), 7)
    backup_node(ctl, src, toks, keys, 0, 6, [transfer(PoolName.MAMBA, [keys[5]], s1)])
    assert b._prefill.tokens_per_s() > 0
    assert b.batch_exists_v2(keys, want).restorable_prefix_pages == [N]
    cache = b._worker.cache
    real = type(cache).stats

    def stats(self):
        return dataclasses.replace(real(self), load_rate=(0.0, 0.0, 1.0, 0.0, 0.0))
    try:
        type(cache).stats = stats  # G2 at a byte a second
        r = b.batch_exists_v2(keys, want)
        assert (r.kv_hit_pages, r.restorable_prefix_pages) == (0, [])
    finally:
        type(cache).stats = real
