"""KvbmConnector with vLLM's hybrid KV cache manager (HMA) on: a model with a
full-attention group and a sliding-window group (hybrid_harness.py) keeps
HMA, its shared prefix goes to G2 and comes back byte for byte in each
group, a sliding window's blocks (which vLLM frees and hands to other
requests) are never stored or loaded stale, and a lost block fails its
request through failed_recving (vLLM refuses block ids with several
groups). A group kvbm cannot keep (Mamba outside vLLM's align mode) makes
it claim no hit, saying so; Mamba in align mode is test_mamba.py's."""
import logging

from harness import require_vllm

require_vllm()

import pytest  # noqa: E402
import torch  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma  # noqa: E402
from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec,  # noqa: E402
                                        FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        MambaSpec, SlidingWindowSpec)

from harness import BLOCK, HEAD, HEADS, MODEL, Engine  # noqa: E402
from test_connector import _SlowStores  # noqa: E402
from hybrid_harness import (LAYERS, NULL, WINDOW, HybridEngine, hybrid_platform,  # noqa: E402
                            key)
from kvbmgo.vllm.config import KvbmConfig  # noqa: E402
from kvbmgo.vllm.groups import KvGroups  # noqa: E402
from kvbmgo.vllm.metadata import BlockStore, KvbmConnectorMetadata  # noqa: E402
from kvbmgo.vllm.scheduler import KvbmScheduler  # noqa: E402
from kvbmgo.vllm.worker import KvbmWorker  # noqa: E402

TURNING_OFF = "Turning off hybrid kv cache manager"


def _where(e, r, k):
    """(group, block index) of key k of request r."""
    for j, h in enumerate(r.block_hashes):
        for g in range(2):
            if key(h, g) == k:
                return g, j
    raise AssertionError(f"{r.request_id}: key {k.hex()} is none of its blocks'")


def _check_ids(e, so, seen=None):
    """Every block this step's metadata stores or loads is, right now, the
    request's block of the group and position its key names (never null,
    never a block vLLM freed and handed on). seen: group 1 (window) id ->
    the (request, position) pairs it held."""
    md = so.kv_connector_metadata
    for item in list(md.stores) + list(md.loads):
        r = e.sched.requests[item.req_id]
        tables = e.tables(item.req_id)
        for k, b in zip(item.keys, item.block_ids):
            g, j = _where(e, r, k)
            assert b != NULL and tables[g][j] == b, \
                f"{item.req_id} block {j} group {g}: G1 {b}, its table holds {tables[g][j]}"
    if seen is not None:
        for req_id in so.num_scheduled_tokens:
            for j, b in enumerate(e.tables(req_id)[1]):
                if b != NULL:
                    seen.setdefault(b, set()).add((req_id, j))


def _cached(e, prompt):
    """A runs prompt; its blocks reach G2 and the scheduler hears of them;
    then vLLM forgets its own prefix cache and G1 is zeroed."""
    e.add("A", prompt)
    e.run()
    e.settle()
    assert e.sched.reset_prefix_cache()
    e.raw.zero_()


def test_vllm_keeps_its_hybrid_kv_cache_manager_on():
    e = HybridEngine({"g2_blocks": 16})
    try:
        assert e.vc.scheduler_config.disable_hybrid_kv_cache_manager is False
        assert not [r for r in e.config_log if TURNING_OFF in r.getMessage()]
        assert KVConnectorFactory.supports_hma_config(e.vc.kv_transfer_config)
        assert supports_hma(e.worker) and supports_hma(e.connector)
        assert len(e.sched.kv_cache_manager.kv_cache_config.kv_cache_groups) == 2
    finally:
        e.close()
    # The same platform with a connector that lacks SupportsHMA: vLLM
    # turns HMA off (what the check above would have caught).
    from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig,
                             VllmConfig)
    with hybrid_platform() as log:
        vc = VllmConfig(scheduler_config=SchedulerConfig(max_model_len=2048,
                                                         is_encoder_decoder=False),
                        model_config=ModelConfig(model=MODEL, tokenizer=MODEL,
                                                 skip_tokenizer_init=True, dtype="float16"),
                        cache_config=CacheConfig(block_size=BLOCK),
                        kv_transfer_config=KVTransferConfig(kv_connector="ExampleConnector",
                                                            kv_role="kv_both"),
                        device_config=DeviceConfig("cpu"))
    assert vc.scheduler_config.disable_hybrid_kv_cache_manager is True
    assert [r for r in log if TURNING_OFF in r.getMessage()]


@pytest.mark.parametrize("layout", ["LBNHC", "BLNHC"])
def test_a_shared_prefix_comes_back_byte_for_byte_in_each_group(layout):
    e = HybridEngine({"g2_blocks": 64}, layout=layout, max_batched=32)
    try:
        prompt = list(range(11, 11 + 6 * BLOCK + 3))
        _cached(e, prompt)
        cache = e.worker._worker.worker.cache
        a = e.finished["A"]
        assert a.finish_reason is not None
        e.verify = True  # every kept block checked before every forward
        b = e.add("B", prompt[:6 * BLOCK] + [7, 7, 7, 7, 7])
        steps = []
        e.run(before_forward=lambda so: (_check_ids(e, so), steps.append(so)))
        loads = [ld for so in steps for ld in so.kv_connector_metadata.loads]
        assert len(loads) == 1 and loads[0].is_async
        # Every full-attention block of the hit, and of the window's group
        # those vLLM keeps at the hit's end (96 tokens: blocks 4 and 5).
        hit = 6
        first_kept = (hit * BLOCK - WINDOW + 1) // BLOCK
        want = [key(b.block_hashes[j], g) for j in range(hit) for g in range(2)
                if g == 0 or j >= first_kept]
        assert loads[0].keys == want
        assert e.connector.get_loaded_kv_cache_group_ids(b) == (0, 1)
        assert cache.stats().onboarded == len(want)
        # Nothing reported lost, nor refused by vLLM.
        assert not any(o.invalid_block_ids for o in e.outputs)
        assert not any(o.failed_recving for o in e.outputs)
        assert e.finished["B"].finish_reason.name == "LENGTH"
    finally:
        e.close()


def test_a_load_continues_vllms_own_prefix_hit():
    # vLLM's GPU prefix cache holds A's first two blocks in both groups (X
    # loaded them), kvbm all six: B's load starts after the GPU's hit and
    # fills the full group's blocks 2-5 and the window's 4 and 5.
    e = HybridEngine({"g2_blocks": 64}, max_batched=32)
    try:
        prompt = list(range(11, 11 + 6 * BLOCK + 3))
        _cached(e, prompt)
        e.add("X", prompt[:2 * BLOCK] + [3])
        e.run()
        e.verify = True
        b = e.add("B", prompt)
        steps = []
        e.run(before_forward=lambda so: (_check_ids(e, so), steps.append(so)))
        loads = [ld for so in steps for ld in so.kv_connector_metadata.loads]
        assert len(loads) == 1
        assert loads[0].keys == [key(b.block_hashes[j], g) for j in range(2, 6) for g in range(2)
                                 if g == 0 or j >= 4]
        assert e.sched.requests == {} and e.finished["B"].finish_reason.name == "LENGTH"
    finally:
        e.close()


def test_block_hashes_finer_than_blocks():
    # vLLM's hashes at 8 tokens (hash_block_size, prefix_match_unit) under
    # 16-token blocks: a block's key is its last hash's.
    e = HybridEngine({"g2_blocks": 64}, max_batched=32, hash_block=BLOCK // 2)
    try:
        prompt = list(range(11, 11 + 6 * BLOCK + 3))
        _cached(e, prompt)
        e.verify = True
        b = e.add("B", prompt)
        assert len(b.block_hashes) == 2 * 6
        steps = []
        e.run(before_forward=steps.append)
        loads = [ld for so in steps for ld in so.kv_connector_metadata.loads]
        assert len(loads) == 1
        assert loads[0].keys == [key(e.bh(b, j), g) for j in range(6) for g in range(2)
                                 if g == 0 or j >= 4]
        assert e.finished["B"].finish_reason.name == "LENGTH"
    finally:
        e.close()


def test_window_blocks_are_never_stored_or_loaded_stale():
    # A small G1, two long prompts prefilled two blocks a step: the window's
    # blocks vLLM frees behind each request go to the other at once, while
    # their stores may still be reading them.
    # Stores read G1 as late as they may (_SlowStores: when waited for).
    e = HybridEngine({"g2_blocks": 128}, num_blocks=40, max_batched=64)
    try:
        w = e.worker._worker
        w.worker = _SlowStores(w.worker)
        seen = {}
        p1 = list(range(100, 100 + 10 * BLOCK + 1))
        p2 = list(range(3000, 3000 + 10 * BLOCK + 1))
        e.add("A", p1)
        e.add("C", p2)
        e.run(before_forward=lambda so: _check_ids(e, so, seen))
        # Some window block held two requests' (or two positions') KV.
        assert any(len(v) > 1 for v in seen.values()), seen
        for st in w._stores:  # the copies still in flight land now
            st.n.wait()
        e.settle()
        assert e.sched.reset_prefix_cache()
        e.raw.zero_()
        # Every prefix of both comes back right, byte for byte, checked
        # before each forward: a prefix of n blocks loads the window's
        # blocks n-2 and n-1, so every window block stored is loaded once.
        e.verify = True
        reqs = []
        for n in range(2, 11):
            for name, p in (("A", p1), ("C", p2)):
                reqs.append(e.add(f"{name}{n}", p[:n * BLOCK] + [5]))
                e.run(before_forward=lambda so: _check_ids(e, so))
                assert e.sched.reset_prefix_cache()
                e.raw.zero_()
        st = e.worker._worker.worker.cache.stats()
        assert st.onboarded == 2 * sum(n + 2 for n in range(2, 11)), st
        assert not any(o.failed_recving or o.invalid_block_ids for o in e.outputs)
        for r in reqs:
            assert e.finished[r.request_id].finish_reason.name == "LENGTH"
    finally:
        e.close()


def test_events_name_each_groups_block_with_vllms_hash():
    from vllm.distributed.kv_events import BlockStored
    e = HybridEngine({"g2_blocks": 64}, max_batched=16, serial=True)
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
        e.settle()
        stored = [ev for bt in batches for ev in bt.events
                  if isinstance(ev, BlockStored) and ev.medium == "CPU"]
        got = {(bytes(ev.block_hashes[0]), ev.group_idx) for ev in stored}
        assert got == {(bytes(a.block_hashes[j]), g) for j in range(3) for g in range(2)}
        for ev in stored:
            assert ev.kv_cache_spec_sliding_window == (WINDOW if ev.group_idx == 1 else None)
            assert ev.kv_cache_spec_kind is not None
            j = [bytes(h) for h in a.block_hashes].index(bytes(ev.block_hashes[0]))
            assert list(ev.token_ids) == list(range(400 + j * BLOCK, 400 + (j + 1) * BLOCK))
            assert ev.parent_block_hash == (bytes(a.block_hashes[j - 1]) if j else None)
    finally:
        e.close()


def test_a_hit_ends_where_a_window_block_is_missing():
    # A's six blocks are cached in both groups, but the window's block 4 is
    # gone (evicted: its REMOVED event): a hit of six blocks would need it
    # (vLLM keeps the window's blocks 4 and 5 at 96 tokens), so the hit is
    # four blocks, whose window (blocks 2 and 3) is there.
    e = HybridEngine({"g2_blocks": 64}, max_batched=32)
    try:
        prompt = list(range(11, 11 + 6 * BLOCK + 3))
        _cached(e, prompt)
        b = e.add("B", prompt)
        e.connector._scheduler.apply_events([(2, 2, key(b.block_hashes[4], 1))])
        e.verify = True
        steps = []
        e.run(before_forward=steps.append)
        loads = [ld for so in steps for ld in so.kv_connector_metadata.loads]
        assert len(loads) == 1
        assert loads[0].keys == [key(b.block_hashes[j], g) for j in range(4) for g in range(2)
                                 if g == 0 or j >= 2]
        assert not any(o.failed_recving or o.invalid_block_ids for o in e.outputs)
        assert e.finished["B"].finish_reason.name == "LENGTH"
    finally:
        e.close()


def test_preempted_requests_resume_from_the_cache():
    # Too few GPU blocks for two requests growing in both groups: one is
    # preempted, its blocks freed (vLLM 0.34 sends it back whole among the
    # new requests, 0.33 among the cached ones with its whole tables), and it
    # resumes by loading what it had offloaded. Every kept block is checked
    # before every forward; every block stored or loaded is the request's.
    e = HybridEngine({"g2_blocks": 64}, num_blocks=11, serial=True)
    e.verify = True
    try:
        preempted = []

        def look(so):
            _check_ids(e, so)
        orig = e.step

        def step(before_forward=None):
            so, kvo = orig(before_forward)
            preempted.extend(so.preempted_req_ids or ())
            return so, kvo
        e.step = step
        e.add("A", list(range(900, 900 + 2 * BLOCK - 1)), max_tokens=2 * BLOCK)
        e.add("B", list(range(950, 950 + 2 * BLOCK - 1)), max_tokens=2 * BLOCK)
        e.run(before_forward=look)
        assert preempted, "a request was preempted"
        st = e.worker._worker.worker.cache.stats()
        assert st.onboarded >= 1, st
        assert not any(o.failed_recving or o.invalid_block_ids for o in e.outputs)
        assert {r: o.finish_reason.name for r, o in e.finished.items()} == \
            {"A": "LENGTH", "B": "LENGTH"}
    finally:
        e.close()


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_lost_block_fails_its_request_through_failed_recving(policy):
    e = HybridEngine({"g2_blocks": 64}, policy=policy, max_batched=128)
    try:
        prompt = list(range(11, 11 + 2 * BLOCK + 1))
        _cached(e, prompt)
        b = e.add("B", prompt[:2 * BLOCK] + list(range(2000, 2000 + 2 * BLOCK + 5)))
        # The scheduler's index says (as a stale event would) that B's
        # blocks 2 and 3 are cached in both groups: the hit is 4 blocks,
        # and the load of those fails.
        e.connector._scheduler.apply_events(
            [(1, 2, key(b.block_hashes[j], g)) for j in (2, 3) for g in (0, 1)])
        e.verify = True
        steps = []
        e.run(before_forward=steps.append)
        loads = [ld for so in steps for ld in so.kv_connector_metadata.loads]
        lost = {key(b.block_hashes[j], g) for j in (2, 3) for g in (0, 1)}
        assert len(loads[0].keys) == 4 + 2 and lost < set(loads[0].keys)
        failed = set().union(*(o.failed_recving for o in e.outputs))
        assert failed == {"B"}
        assert not any(o.invalid_block_ids for o in e.outputs)
        # The index forgot the keys the load did not find (LOST events): B
        # is not sent after them again.
        if policy == "fail":
            assert not any(e.connector._scheduler.cached_tiers(k) for k in lost)
            assert len(loads) == 1
            assert e.finished["B"].finish_reason.name == "ERROR"
        else:
            # vLLM recomputes a failed async load whole: B looks up again,
            # loads what is there (blocks 0 and 1) and computes the rest,
            # right (verify checked each forward).
            assert len(loads) == 2 and not lost & set(loads[1].keys)
            assert loads[1].keys == [key(b.block_hashes[j], g) for j in (0, 1) for g in (0, 1)]
            assert e.finished["B"].finish_reason.name == "LENGTH"
            e.settle()
        # C has B's prefix: what kvbm gives it is right, byte for byte.
        assert e.sched.reset_prefix_cache()
        e.raw.zero_()
        e.add("C", list(b.prompt_token_ids[:4 * BLOCK]) + [9, 9, 9])
        e.run()
        assert e.finished["C"].finish_reason.name == "LENGTH"
    finally:
        e.close()


def test_groups_whose_views_differ_in_shape_share_their_pages():
    # The window group has 1 KV head of 32 where the full one has 2 of 16:
    # the same bytes per page, and vLLM lays both groups over the same
    # pages. kvbm registers the pages once; each group's bytes come back.
    e = HybridEngine({"g2_blocks": 64}, max_batched=32, window_heads=1)
    try:
        assert tuple(e.views[LAYERS[1]].shape) != tuple(e.views[LAYERS[0]].shape)
        prompt = list(range(11, 11 + 6 * BLOCK + 3))
        _cached(e, prompt)
        e.verify = True
        e.add("B", prompt)
        e.run()
        assert e.worker._worker.worker.cache.stats().onboarded == 6 + 2
        assert not any(o.failed_recving or o.invalid_block_ids for o in e.outputs)
    finally:
        e.close()


def test_a_group_whose_blocks_do_not_line_up_fails_at_start_naming_the_groups():
    # A layer over another's memory whose blocks are laid out otherwise
    # (here: twice the block stride) is not covered by that one's
    # registration: refused when the KV caches are registered, naming the
    # groups' shapes.
    groups = KvGroups.from_config(_two_groups_config(), BLOCK)
    raw = torch.zeros(16 * 2 * HEADS * BLOCK * 2 * HEAD, dtype=torch.float16)
    full = raw[:16 * HEADS * BLOCK * 2 * HEAD].view(16, HEADS, BLOCK, 2 * HEAD)
    odd = raw.view(16, 2, HEADS, BLOCK, 2 * HEAD)[:, 0]
    w = KvbmWorker(KvbmConfig(g2_blocks=4), groups=groups, engine_id="alias-test")
    try:
        with pytest.raises(ValueError) as err:
            w.register_kv_caches({LAYERS[0]: full, LAYERS[1]: odd})
        msg = str(err.value)
        assert f"layer {LAYERS[1]}" in msg and "shares the memory of layer" in msg, msg
        assert "group 0 (full, 1 layers): (16, 2, 16, 32)" in msg, msg
        assert "group 1 (window, 1 layers): (16, 2, 16, 32)" in msg, msg
    finally:
        w.shutdown()


def _two_groups_config():
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                             dtype=torch.float16)
    window = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                               dtype=torch.float16, sliding_window=WINDOW)
    return KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec([LAYERS[0]], full),
                                          KVCacheGroupSpec([LAYERS[1]], window)],
                         hash_block_size=BLOCK)


def test_pd_with_a_group_kvbm_cannot_keep_is_refused_and_computed_here(caplog):
    # P/D with full + sliding-window groups: test_disagg_hybrid.py; with a
    # Mamba group: test_mamba.py. With a group kvbm keeps nothing of
    # (chunked local attention) a decode request asking for a remote
    # prefill is computed here, a prefill request holds nothing and returns
    # no kv_transfer_params; said once.
    chunked = ChunkedLocalAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                                        dtype=torch.float16, attention_chunk_size=2 * BLOCK)
    e = HybridEngine({"g2_blocks": 16}, max_batched=32,
                     extra_groups=[KVCacheGroupSpec(["model.layers.4.attn"], chunked)])
    try:
        remote = dict(do_remote_prefill=True, remote_engine_id="p", remote_request_id="x",
                      remote_host="127.0.0.1", remote_port=1, remote_block_ids=([1], [2]))
        with caplog.at_level(logging.WARNING, logger="kvbmgo"):
            e.add("D", list(range(10, 10 + 2 * BLOCK + 1)), kv_transfer_params=remote)
            e.add("P", list(range(70, 70 + 2 * BLOCK + 1)),
                  kv_transfer_params=dict(do_remote_decode=True))
            e.run()
        assert {r: o.finish_reason.name for r, o in e.finished.items()} == \
            {"D": "LENGTH", "P": "LENGTH"}
        assert e.finished["P"].kv_transfer_params is None
        assert not e.sched.requests  # nothing held for a decode
        said = [r for r in caplog.records if "prefill->decode is off" in r.getMessage()]
        assert len(said) == 1 and "ChunkedLocalAttentionSpec" in said[0].getMessage()
    finally:
        e.close()


def _mamba_config(num_blocks=16):
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                             dtype=torch.float16)
    window = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                               dtype=torch.float16, sliding_window=WINDOW)
    mamba = MambaSpec(block_size=BLOCK, shapes=((HEADS * BLOCK * 2 * HEAD,),),
                      dtypes=(torch.int8,), mamba_cache_mode="none")
    groups = [KVCacheGroupSpec([LAYERS[0]], full), KVCacheGroupSpec([LAYERS[1]], window),
              KVCacheGroupSpec(["model.layers.4.mixer"], mamba)]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
                         hash_block_size=BLOCK)


class _Request:
    def __init__(self, hashes, num_tokens):
        self.request_id = "R"
        self.block_hashes = hashes
        self.num_tokens = num_tokens
        self.prompt_token_ids = list(range(num_tokens))
        self.kv_transfer_params = None


def test_a_mamba_group_outside_align_mode_is_excluded_honestly(caplog):
    # Mamba states sit at block boundaries only in vLLM's align mode
    # (test_mamba.py keeps them); another mode's group is named, not kept.
    groups = KvGroups.from_config(_mamba_config(), BLOCK)
    assert groups.hybrid and groups.inert is not None
    assert "KV cache group 2 (MambaSpec: model.layers.4.mixer)" in groups.inert
    assert "mamba_cache_mode is 'none'" in groups.inert
    with caplog.at_level(logging.WARNING, logger="kvbmgo"):
        s = KvbmScheduler(KvbmConfig(), BLOCK, groups=groups)
    warnings = [r for r in caplog.records if "KV cache group 2" in r.getMessage()]
    assert len(warnings) == 1 and "MambaSpec" in warnings[0].getMessage()
    # Every attention block is in the index: still no hit (a hit would leave
    # the Mamba state at its boundary wrong).
    hashes = [bytes([j]) * 32 for j in range(4)]
    s.apply_events([(1, 2, groups.key(h, g)) for h in hashes for g in groups.kept])
    assert s.get_num_new_matched_tokens(_Request(hashes, 4 * BLOCK + 1), 0) == (0, False)
    # The worker registers nothing (a Mamba view is no attention page: it
    # cannot fail the engine's start), and its calls do nothing.
    w = KvbmWorker(KvbmConfig(g2_blocks=4), groups=groups, engine_id="mamba-test")
    try:
        views = {LAYERS[0]: torch.zeros(16, HEADS, BLOCK, 2 * HEAD, dtype=torch.float16),
                 LAYERS[1]: torch.zeros(16, HEADS, BLOCK, 2 * HEAD, dtype=torch.float16),
                 "model.layers.4.mixer": torch.zeros(16, 1, 1, 1000, dtype=torch.int8)}
        w.register_kv_caches(views)
        assert w.worker is None
        md = KvbmConnectorMetadata(stores=[BlockStore("R", [b"k" * 32], [3])], allocated=[3])
        w.bind()
        w.handle_preemptions(md)
        w.start_load_kv(md)
        w.wait_for_save(md)
        assert w.get_finished() == (None, None) and w.build_worker_meta() is None
    finally:
        w.shutdown()


def test_a_group_kvbm_cannot_keep_leaves_hma_on_and_nothing_in_kvbm():
    # vLLM's real scheduler with a chunked-local-attention group (a kind
    # kvbm does not keep; vLLM refuses Mamba outside align mode with prefix
    # caching on) beside the two attention groups: HMA stays on, requests
    # run, and the connector neither stores nor claims anything.
    chunked = ChunkedLocalAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                                        dtype=torch.float16, attention_chunk_size=2 * BLOCK)
    e = HybridEngine({"g2_blocks": 64}, max_batched=32,
                     extra_groups=[KVCacheGroupSpec(["model.layers.4.attn"], chunked)])
    try:
        assert e.vc.scheduler_config.disable_hybrid_kv_cache_manager is False
        assert len(e.sched.kv_cache_manager.kv_cache_config.kv_cache_groups) == 3
        assert "KV cache group 2 (ChunkedLocalAttentionSpec" in e.connector.groups.inert
        prompt = list(range(11, 11 + 6 * BLOCK + 3))
        steps = []
        e.add("A", prompt)
        e.run(before_forward=steps.append)
        assert e.sched.reset_prefix_cache()
        e.add("B", prompt)
        e.run(before_forward=steps.append)
        assert not any(so.kv_connector_metadata.loads or so.kv_connector_metadata.stores
                       for so in steps)
        assert {r: o.finish_reason.name for r, o in e.finished.items()} == \
            {"A": "LENGTH", "B": "LENGTH"}
    finally:
        e.close()


def test_one_group_with_hma_on_is_as_before():
    # With HMA on and one group (a model without hybrid layers) nothing
    # changes: keys are vLLM's block hashes, loads are sync (load_mode's
    # default), request_finished_all_groups is request_finished.
    groups = KvGroups.from_config(_one_group_config(), BLOCK)
    assert not groups.hybrid and groups.layer_names is None
    h = bytes(range(32))
    assert groups.key(h, groups.kept[0]) == h
    with hybrid_platform():
        e = Engine({"g2_blocks": 16})
    try:
        assert e.vc.scheduler_config.disable_hybrid_kv_cache_manager is False
        prompt = list(range(11, 11 + 3 * BLOCK + 1))
        _cached(e, prompt)
        e.verify = True
        b = e.add("B", prompt)
        steps = []
        e.run(before_forward=steps.append)
        loads = [ld for so in steps for ld in so.kv_connector_metadata.loads]
        assert len(loads) == 1 and not loads[0].is_async
        assert loads[0].keys == [bytes(h) for h in b.block_hashes[:3]]
    finally:
        e.close()


def _one_group_config():
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                             dtype=torch.float16)
    return KVCacheConfig(num_blocks=8, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(list(LAYERS[:2]), spec)])
