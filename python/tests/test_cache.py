"""The prefix cache through kvbmgo: keys in, blocks found by the library."""
import hashlib
import threading

import numpy as np
import pytest

import kvbmgo
from kvbmgo import (CacheEventKind, Decision, Event, LayoutConfig, Tier, Worker, WriteMode)
from kvbmgo.errors import (AlreadyExistsError, FailedPreconditionError, InvalidArgumentError,
                           KvbmError, NotFoundError, OutOfRangeError)

from conftest import new_worker_id

BLOCKS, LAYERS, OUTER, PAGE, INNER = 16, 3, 2, 4, 32


def block_hashes(tokens, parent=b""):
    """vLLM-style chained block hashes: each names its block and its whole prefix."""
    out = []
    for i in range(0, len(tokens), PAGE):
        parent = hashlib.sha256(parent + bytes(tokens[i:i + PAGE])).digest()
        out.append(parent)
    return out


def kv_of(key: bytes, layer: int) -> np.ndarray:
    """The KV of one block of one layer, derived from its key."""
    seed = int.from_bytes(key[:4], "little") + layer * 7919
    return ((np.arange(OUTER * PAGE * INNER, dtype=np.uint32) * 31 + seed) % 65521).astype(
        np.uint16).reshape(OUTER, PAGE, INNER)


@pytest.fixture
def cached(tmp_path):
    """A worker with G1 (16 blocks), a small G2 (4), G3 (8) and an object
    store, and its cache; yields (worker, layers)."""
    layers = [np.zeros((BLOCKS, OUTER, PAGE, INNER), dtype=np.uint16) for _ in range(LAYERS)]
    cfg = LayoutConfig(num_blocks=BLOCKS, num_layers=LAYERS, outer_dim=OUTER, page_size=PAGE,
                       inner_dim=INNER, dtype_width=2, layout="layer_separate", block_dim="first")
    (tmp_path / "disk").mkdir(mode=0o700)
    with Worker(new_worker_id(), disk_dir=tmp_path / "disk", object_dir=tmp_path / "g4") as w:
        w.register_g1(cfg, layers)
        host = cfg.replace(layout="fully_contiguous")
        w.allocate_g2(host.replace(num_blocks=4))
        w.allocate_g3(host.replace(num_blocks=8))
        w.enable_cache()
        yield w, layers


def compute(layers, g1_ids, keys):
    for bid, key in zip(g1_ids, keys):
        for l, a in enumerate(layers):
            a[bid] = kv_of(key, l)


def check_loaded(layers, g1_ids, keys):
    for bid, key in zip(g1_ids, keys):
        for l, a in enumerate(layers):
            np.testing.assert_array_equal(a[bid], kv_of(key, l), err_msg=f"G1 block {bid} layer {l}")


def test_two_requests_share_a_prefix(cached):
    w, layers = cached
    prompt = list(range(6 * PAGE))
    keys_a = block_hashes(prompt)
    compute(layers, range(6), keys_a)
    # Offloaded in two chunks, as a chunked prefill does; in one call the
    # 4-block G2 takes 4 (a block being stored is never evicted for another).
    n, decisions = w.cache.offload(keys_a, list(range(6)))
    with n:
        assert n.wait(10)
    assert decisions == [Decision.STORE] * 4 + [Decision.NO_SPACE] * 2
    n, decisions = w.cache.offload(keys_a[4:], [4, 5])
    with n:
        assert n.wait(10)
    assert decisions == [Decision.STORE] * 2
    # B shares A's prompt and goes on: 6 of its 7 blocks are cached, in G3
    # (evicted from the 4-block G2, written back) and G2.
    keys_b = block_hashes(prompt + [99] * PAGE)
    matched, tiers = w.cache.match(keys_b)
    assert matched == 6
    assert tiers == [Tier.G3, Tier.G3, Tier.G2, Tier.G2, Tier.G2, Tier.G2]
    for a in layers:
        a[:] = 0
    with w.cache.onboard(keys_b[:6], list(range(8, 14))) as n:
        assert n.wait(10)
    check_loaded(layers, range(8, 14), keys_a)
    for a in layers:
        assert not a[:8].any() and not a[14:].any(), "blocks around the load stay untouched"
    st = w.cache.stats()
    assert (st.onboarded, st.onboarded_from_g2, st.onboarded_from_g3) == (6, 4, 2)
    assert st.g2.capacity == 4 and st.g3.capacity == 8
    events = w.cache.events()
    stored_g2 = [e.key for e in events if e.kind == CacheEventKind.STORED and e.tier == Tier.G2]
    assert stored_g2[:6] == keys_a
    removed_g2 = [e.key for e in events if e.kind == CacheEventKind.REMOVED and e.tier == Tier.G2]
    assert removed_g2[:2] == keys_a[:2]
    assert w.cache.events() == []


def test_str_keys_dedupe_and_layer_events(cached):
    w, layers = cached
    keys = [f"{i:064x}" for i in range(3)]  # SGLang's hex page keys
    raw = [k.encode() for k in keys]
    compute(layers, [0, 1, 2], raw)
    n, d = w.cache.offload(keys, [0, 1, 2])
    with n:
        n.wait(10)
    n, d = w.cache.offload(keys[:2], [0, 1])
    with n:
        n.wait(10)
    assert d == [Decision.PRESENT, Decision.PRESENT]
    events = [Event() for _ in range(LAYERS)]
    try:
        with w.cache.onboard(keys, [5, 6, 7], layer_events=events) as n:
            for e in events:
                e.synchronize()
            assert n.wait(10)
    finally:
        for e in events:
            e.close()
    check_loaded(layers, [5, 6, 7], raw)


def test_a_key_no_longer_cached_fails_its_block_only(cached):
    w, layers = cached
    k = [b"k-%d" % i for i in range(2)]
    compute(layers, [0, 1], k)
    with w.cache.offload(k, [0, 1])[0] as n:
        n.wait(10)
    with w.cache.onboard([k[0], b"never-stored", k[1]], [4, 5, 6]) as n:
        with pytest.raises(NotFoundError):
            n.wait(10)
        assert n.failed_blocks() == [5]
    check_loaded(layers, [4, 6], k)


def test_bad_input(cached):
    w, _ = cached
    with pytest.raises(InvalidArgumentError):
        w.cache.match([b"x" * 65])
    with pytest.raises(InvalidArgumentError):
        w.cache.match([b""])
    with pytest.raises(InvalidArgumentError):
        w.cache.offload([b"a", b"a"], [0, 1])
    with pytest.raises(ValueError, match="as long"):
        w.cache.offload([b"a", b"b"], [0])
    with pytest.raises(OutOfRangeError):
        w.cache.offload([b"a"], [BLOCKS])
    with pytest.raises(InvalidArgumentError):
        w.cache.offload([b"a"], [-1])
    with pytest.raises(InvalidArgumentError):
        w.cache.onboard([b"a", b"b"], [3, 3])
    with pytest.raises(AlreadyExistsError):
        w.enable_cache()
    assert w.cache.stats().offloaded == 0, "nothing changed"


def test_cache_needs_enabling_and_g2(tmp_path):
    with Worker(new_worker_id()) as w:
        with pytest.raises(FailedPreconditionError, match="enable_cache"):
            w.cache
        with pytest.raises(NotFoundError):
            w.enable_cache()
        with pytest.raises(ValueError):
            w.enable_cache(g3="sometimes")


def test_write_modes_by_name(tmp_path):
    layers = [np.zeros((4, OUTER, PAGE, INNER), dtype=np.uint16) for _ in range(LAYERS)]
    cfg = LayoutConfig(num_blocks=4, num_layers=LAYERS, outer_dim=OUTER, page_size=PAGE,
                       inner_dim=INNER, dtype_width=2, layout="layer_separate", block_dim="first")
    (tmp_path / "d").mkdir(mode=0o700)
    with Worker(new_worker_id(), disk_dir=tmp_path / "d") as w:
        w.register_g1(cfg, layers)
        w.allocate_g2(cfg.replace(layout="fully_contiguous"))
        w.allocate_g3(cfg.replace(layout="fully_contiguous"))
        c = w.enable_cache(g3="write-through", admit_after=2)
        compute(layers, [0], [b"wt"])
        with c.offload([b"wt"], [0])[0] as n:
            n.wait(10)
        assert c.match([b"wt"]) == (0, []), "not admitted the first time"
        n, d = c.offload([b"wt"], [0])
        with n:
            n.wait(10)
        assert d == [Decision.STORE]
        for _ in range(100):  # the write-through to G3 runs in the background
            if c.stats().g3.registered == 1:
                break
            threading.Event().wait(0.01)
        assert c.stats().g3.registered == 1


def test_many_threads(cached):
    w, layers = cached
    keys = [b"t-%02d" % i for i in range(8)]
    compute(layers, range(8), keys)
    errors = []

    def run(t):
        try:
            for r in range(10):
                i = (t + r) % 7
                with w.cache.offload(keys[i:i + 2], [i, i + 1])[0] as n:
                    n.wait(10)
                m, _ = w.cache.match(keys[i:i + 2])
                if m:
                    dst = [8 + 2 * t + j for j in range(m)]
                    with w.cache.onboard(keys[i:i + m], dst) as n:
                        try:
                            n.wait(10)
                        except KvbmError:
                            continue  # evicted between match and onboard: reported, fine
                    check_loaded(layers, dst, keys[i:i + m])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
