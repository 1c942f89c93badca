"""KvbmConnector with a Mamba / linear-attention hybrid (mamba_harness.py:
vLLM's real scheduler and its align cache mode): the Mamba group is kept,
its states after whole blocks are stored from the exact blocks vLLM offers
(boundary_state_offloads) and loaded into the block vLLM reads a hit's
state from, byte for byte; a hit ends only where the state is held; a
state that is missing, lost or stale is never loaded as if right."""
from harness import require_vllm

require_vllm()

import pytest  # noqa: E402
import torch  # noqa: E402

from harness import BLOCK  # noqa: E402
from hybrid_harness import key  # noqa: E402
from mamba_harness import NULL, MambaEngine  # noqa: E402
from kvbmgo.vllm.groups import KvGroups  # noqa: E402
from kvbmgo.vllm.kv_views import g1_layout  # noqa: E402


def _cached(e, prompt, max_tokens=1):
    """A computes prompt; its blocks and states reach G2 and the scheduler
    hears of them; then vLLM forgets its prefix cache and G1 is zeroed."""
    a = e.add("A", prompt, max_tokens=max_tokens)
    e.run()
    e.settle()
    assert e.sched.reset_prefix_cache()
    e.raw.zero_()
    return [bytes(h) for h in a.block_hashes]


def _run(e, name, prompt):
    """Runs request name with every G1 block and state checked before each
    forward; returns it and the steps' metadata."""
    e.verify = True
    r = e.add(name, prompt)
    mds = []
    e.run(before_forward=lambda so: mds.append(so.kv_connector_metadata))
    return r, mds


def test_vllm_keeps_hma_and_kvbm_keeps_the_mamba_group():
    e = MambaEngine({"g2_blocks": 16})
    try:
        assert e.vc.scheduler_config.disable_hybrid_kv_cache_manager is False
        groups = e.connector.groups
        assert groups.inert is None
        assert [(g.index, g.kind) for g in groups.kept] == [(0, "full"), (1, "mamba")]
        assert e.connector.get_loaded_kv_cache_group_ids(None) == (0, 1)
    finally:
        e.close()


@pytest.mark.parametrize("window,layout,attention_layers", [
    (False, "LBNHC", 2), (True, "LBNHC", 2), (False, "BLNHC", 2), (False, "LBNHC", 1),
    (False, "BLNHC", 1)])
def test_states_come_back_at_a_boundary_byte_for_byte(window, layout, attention_layers):
    # Layouts: layer-outer, block-outer, and a Mamba layer whose pages no
    # attention layer shares (G1 then registered as pages of bytes).
    e = MambaEngine({"g2_blocks": 96}, window=window, max_batched=64, layout=layout,
                    attention_layers=attention_layers)
    try:
        cfg, buffers, index = g1_layout(e.views)
        # A kvbm layer per distinct page; Mamba layers alias attention ones
        # but where none does (pages of bytes: the padded page, or under a
        # block-outer layout the whole packed block, one region).
        raw = (int(e.raw.data_ptr()), int(e.raw.data_ptr()) + e.raw.numel())
        spans = sorted((b.address, b.address + b.nbytes) for b in buffers)
        assert all(raw[0] <= a and z <= raw[1] for a, z in spans), (spans, raw)
        assert all(z <= a2 for (_, z), (a2, _) in zip(spans, spans[1:])), spans
        if attention_layers == 2:
            assert cfg.num_layers == 2 and len(set(index.values())) == 2
            assert cfg.dtype_width == 2
        elif layout == "LBNHC":
            assert (cfg.num_layers, cfg.inner_dim, cfg.dtype_width) == (2, 2048, 1)
        else:
            assert (cfg.num_layers, cfg.inner_dim, cfg.dtype_width) == (1, 4096, 1)
        prompt = list(range(11, 11 + 9 * BLOCK + 6))  # 150 tokens: chunks end at 64, 128, 144
        a_hashes = _cached(e, prompt)
        # The states vLLM offered were stored: after 64, 128 and 144 tokens.
        for tokens in (64, 128, 144):
            assert e.connector._scheduler.cached_tiers(key(a_hashes[tokens // BLOCK - 1], 1)), \
                f"no state after {tokens} tokens in G2"
        b, mds = _run(e, "B", prompt[:9 * BLOCK] + [7, 7, 7, 7, 7])
        loads = [ld for md in mds for ld in md.loads]
        assert len(loads) == 1 and loads[0].is_async
        hit = 9  # blocks: the state after 144 tokens is held
        ks = set(loads[0].keys)
        assert {key(b.block_hashes[j], 0) for j in range(hit)} <= ks
        assert key(b.block_hashes[hit - 1], 1) in ks
        # One state only, the hit's end (not one per block).
        assert [k for k in ks if k.endswith(b"/g001")] == [key(b.block_hashes[hit - 1], 1)]
        assert e.finished["B"].finish_reason is not None
        # The forward read the loaded state (verify) and wrote the next
        # one from it: B's own state after its prompt is right.
        assert ("B", len(b.prompt_token_ids)) in e.states
    finally:
        e.close()


def test_a_hit_ends_where_the_state_is_held():
    # The state after 144 tokens is dropped from the cache: the hit is
    # shortened to the last boundary with a state (128), never past it.
    e = MambaEngine({"g2_blocks": 96})
    try:
        prompt = list(range(11, 11 + 9 * BLOCK + 6))
        hashes = _cached(e, prompt)
        e.connector._scheduler._tiers.pop(key(hashes[8], 1))
        b, mds = _run(e, "B", prompt[:9 * BLOCK] + [7, 7, 7, 7, 7])
        loads = [ld for md in mds for ld in md.loads]
        assert len(loads) == 1
        assert key(b.block_hashes[7], 1) in loads[0].keys
        assert key(b.block_hashes[8], 0) not in loads[0].keys
    finally:
        e.close()


def test_a_local_hit_of_the_first_blocks_leaves_the_state_to_the_load():
    # vLLM's own prefix cache holds the first 4 blocks and the state after
    # them (C's); the cache holds all 9 and the states after 4, 8 and 9.
    # B's hit is cut in two: vLLM's local 4 blocks, kvbm's 5 after them
    # with the state after 9 into B's entry 8, which B's forward reads
    # (verify): the local state after 4 blocks is not where B starts.
    e = MambaEngine({"g2_blocks": 96})
    try:
        prompt = list(range(11, 11 + 9 * BLOCK + 6))
        _cached(e, prompt)
        c, _ = _run(e, "C", prompt[:4 * BLOCK] + [5, 5, 5])
        b, mds = _run(e, "B", prompt[:9 * BLOCK] + [7, 7, 7, 7, 7])
        loads = [ld for md in mds for ld in md.loads]
        assert len(loads) == 1
        ks = set(loads[0].keys)
        assert not {key(b.block_hashes[j], g) for j in range(4) for g in (0, 1)} & ks
        assert {key(b.block_hashes[j], 0) for j in range(4, 9)} <= ks
        assert [k for k in ks if k.endswith(b"/g001")] == [key(b.block_hashes[8], 1)]
        assert not any(o.failed_recving for o in e.outputs)
        assert ("B", len(b.prompt_token_ids)) in e.states
    finally:
        e.close()


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_lost_state_fails_its_request_through_failed_recving(policy):
    # The index says (as a stale event would) that block 9 and the state
    # after it are cached: the hit is 10 blocks and that load fails. The
    # request goes through failed_recving (vLLM takes no block ids with
    # several groups); recomputed, its second load stops at the state after
    # 144 tokens; its state is never read from a block the load left.
    e = MambaEngine({"g2_blocks": 96}, policy=policy)
    try:
        prompt = list(range(11, 11 + 9 * BLOCK + 6))
        _cached(e, prompt)
        b_prompt = prompt[:9 * BLOCK] + list(range(3000, 3000 + BLOCK + 3))
        e.verify = True
        b = e.add("B", b_prompt)
        lost = [key(b.block_hashes[9], g) for g in (0, 1)]
        e.connector._scheduler.apply_events([(1, 2, k) for k in lost])
        mds = []
        e.run(before_forward=lambda so: mds.append(so.kv_connector_metadata))
        loads = [ld for md in mds for ld in md.loads]
        assert set(lost) < set(loads[0].keys)
        failed = set().union(*(o.failed_recving or set() for o in e.outputs))
        assert failed == {"B"}
        assert not any(o.invalid_block_ids for o in e.outputs)
        if policy == "fail":
            assert len(loads) == 1
            assert e.finished["B"].finish_reason.name == "ERROR"
        else:
            assert len(loads) == 2 and not set(lost) & set(loads[1].keys)
            assert key(b.block_hashes[8], 1) in loads[1].keys
            assert e.finished["B"].finish_reason.name == "LENGTH"
            assert ("B", len(b_prompt)) in e.states
    finally:
        e.close()


def test_a_mamba_group_outside_align_mode_is_excluded_naming_it():
    from mamba_harness import MambaSpec, FullAttentionSpec, KVCacheGroupSpec, KVCacheConfig
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16,
                             dtype=torch.float16)
    mamba = MambaSpec(block_size=BLOCK, shapes=((96,),), dtypes=(torch.int8,),
                      mamba_cache_mode="all")
    cfg = KVCacheConfig(num_blocks=8, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["a"], full),
                                         KVCacheGroupSpec(["m"], mamba)])
    groups = KvGroups.from_config(cfg, BLOCK)
    assert groups.inert is not None
    assert "KV cache group 1 (MambaSpec: m)" in groups.inert
    assert "mamba_cache_mode is 'all'" in groups.inert


@pytest.mark.parametrize("num_blocks", [9, 10, 11])
def test_preempted_requests_resume_from_the_cache(num_blocks):
    # Too few GPU blocks for two requests growing in both groups: one is
    # preempted, its blocks freed, and it resumes by loading what it had
    # offloaded (its attention blocks and the state at their end). Every
    # block and state is checked before every forward.
    e = MambaEngine({"g2_blocks": 64}, num_blocks=num_blocks, serial=True)
    e.verify = True
    try:
        preempted = []
        orig = e.step

        def step(before_forward=None):
            so, kvo = orig(before_forward)
            preempted.extend(so.preempted_req_ids or ())
            return so, kvo
        e.step = step
        e.add("A", list(range(900, 900 + 2 * BLOCK - 1)), max_tokens=3 * BLOCK)
        e.add("B", list(range(950, 950 + 2 * BLOCK - 1)), max_tokens=3 * BLOCK)
        e.run()
        assert preempted, "a request was preempted"
        st = e.worker._worker.worker.cache.stats()
        assert st.onboarded >= 3, st  # two attention blocks and the state at their end
        assert not any(o.failed_recving or o.invalid_block_ids for o in e.outputs)
        assert {r: o.finish_reason.name for r, o in e.finished.items()} == \
            {"A": "LENGTH", "B": "LENGTH"}
    finally:
        e.close()


def test_no_store_reads_a_block_vllm_zeroed():
    # vLLM zeroes the blocks it hands out when a step starts, before the
    # connector's calls (models with Mamba layers); stores that read G1 as
    # late as they may (_SlowStores: when waited for) must have read theirs
    # by then: every block and state C loads is A's and B's, byte for byte.
    from test_connector import _SlowStores
    # 16 GPU blocks: state blocks vLLM frees are handed out again (and
    # zeroed) while the stores that read them are in flight.
    e = MambaEngine({"g2_blocks": 96}, num_blocks=16)
    try:
        w = e.worker._worker
        w.worker = _SlowStores(w.worker)
        assert e.connector.groups.zeroed
        a = list(range(11, 11 + 2 * BLOCK + 3))
        b = list(range(500, 500 + 2 * BLOCK + 3))
        e.add("A", a, max_tokens=2 * BLOCK)
        e.add("B", b, max_tokens=2 * BLOCK)
        e.run()
        for st in w._stores:  # the copies still in flight land now
            st.n.wait()
        e.settle()
        assert e.sched.reset_prefix_cache()
        e.raw.zero_()
        e.verify = True
        e.add("C", a[:2 * BLOCK] + [5, 5, 5])
        e.add("D", b[:2 * BLOCK] + [5, 5, 5])
        mds = []
        e.run(before_forward=lambda so: mds.append(so.kv_connector_metadata))
        loads = [ld for md in mds for ld in md.loads]
        assert len(loads) == 2
        assert not any(o.failed_recving for o in e.outputs)
    finally:
        e.close()


def test_views_of_kernel_blocks_fail_at_start_naming_the_layer():
    # An attention kernel's block smaller than vLLM's (a Mamba hybrid
    # scales vLLM's attention block up to the state's page): dim 0 of the
    # views counts kernel blocks. kvbm would take them for vLLM's blocks;
    # it refuses at start instead, never mid-request.
    from kvbmgo.vllm.config import KvbmConfig
    from kvbmgo.vllm.worker import KvbmWorker
    from mamba_harness import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16,
                             dtype=torch.float16)
    cfg = KVCacheConfig(num_blocks=8, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["a"], full)])
    groups = KvGroups.from_config(cfg, BLOCK)
    assert groups.g1_blocks == 8
    w = KvbmWorker(KvbmConfig(g2_blocks=4), groups=groups, engine_id="kernel-blocks")
    try:
        with pytest.raises(ValueError, match=r"views of a hold 16 blocks, vLLM's KV cache has 8"):
            w.register_kv_caches({"a": torch.zeros(16, 2, BLOCK // 2, 32, dtype=torch.float16)})
        assert w.worker is None
    finally:
        w.shutdown()


def test_pd_with_a_mamba_group_can_be_turned_off(caplog):
    # With "pd_mamba": false a request asking for a remote prefill is
    # computed here, and a prefill holds nothing for a decode; said once,
    # naming the group (test_disagg_mamba.py runs P/D, on by default).
    import logging
    from types import SimpleNamespace as NS
    from mamba_harness import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
    from kvbmgo.vllm.config import KvbmConfig
    from kvbmgo.vllm.scheduler import KvbmScheduler
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16,
                             dtype=torch.float16)
    mamba = MambaSpec(block_size=BLOCK, shapes=((96,),), dtypes=(torch.int8,),
                      page_size_padded=full.page_size_bytes, mamba_cache_mode="align")
    groups = KvGroups.from_config(KVCacheConfig(
        num_blocks=8, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["a"], full), KVCacheGroupSpec(["m"], mamba)]), BLOCK)
    with caplog.at_level(logging.WARNING, logger="kvbmgo"):
        assert KvbmConfig().pd_mamba, "on by default"
        s = KvbmScheduler(KvbmConfig(pd_mamba=False), BLOCK, role="kv_both", groups=groups)
        params = {"do_remote_prefill": True, "remote_engine_id": "p", "remote_request_id": "r",
                  "remote_host": "127.0.0.1", "remote_port": 1, "remote_block_ids": [[1], [2]]}
        r = NS(request_id="R", block_hashes=[], num_tokens=3 * BLOCK,
               prompt_token_ids=list(range(3 * BLOCK)), kv_transfer_params=params)
        assert s.get_num_new_matched_tokens(r, 0) == (0, False)
        assert params["do_remote_prefill"] is False
    said = [x.getMessage() for x in caplog.records if "prefill->decode is off" in x.getMessage()]
    assert len(said) == 1 and "Mamba group 1" in said[0] and "pd_mamba" in said[0], said


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_null_state_entry_fails_the_load_not_the_engine(policy, caplog):
    """vLLM 0.33 and 0.34 allocate a block at a hit's last Mamba entry for
    every async load (hybrid loads all are): the scheduler allocates for the
    hit's tokens alone. Were that entry null (a vLLM that allocates
    otherwise), the state would have nowhere to go: here vLLM's own table
    holds the null block there when the real scheduler calls
    update_state_after_alloc. The load is refused, nothing is loaded, the
    request fails through failed_recving (vLLM's policy then recomputes or
    fails it), a warning names the group; nothing raises across the
    engine."""
    import logging
    e = MambaEngine({"g2_blocks": 96}, policy=policy)
    try:
        prompt = list(range(11, 11 + 9 * BLOCK + 6))
        _cached(e, prompt)
        sched = e.connector._scheduler
        real = sched.update_state_after_alloc
        nulled = []

        def null_state_entry(request, blocks, n):
            if n and not nulled:
                table = blocks.blocks[1]  # vLLM's own Mamba table of the request
                i = n // BLOCK - 1
                nulled.append((i, table[i]))
                table[i] = e.sched.kv_cache_manager.block_pool.null_block
                try:
                    return real(request, blocks, n)
                finally:
                    table[i] = nulled[0][1]  # vLLM frees its block as before
            return real(request, blocks, n)

        sched.update_state_after_alloc = null_state_entry
        e.verify = True
        b = e.add("B", prompt)
        mds = []
        with caplog.at_level(logging.WARNING, logger="kvbmgo"):
            e.run(before_forward=lambda so: mds.append(so.kv_connector_metadata))
        assert nulled and nulled[0][0] == 8  # the hit: 9 blocks
        loads = [ld for md in mds for ld in md.loads]
        assert loads[0].refused and not loads[0].keys and not loads[0].block_ids
        failed = set().union(*(o.failed_recving or set() for o in e.outputs))
        assert failed == {"B"}
        assert not any(o.invalid_block_ids for o in e.outputs)
        assert any("Mamba group 1" in r.getMessage() and "entry 8 is null" in r.getMessage()
                   for r in caplog.records)
        if policy == "fail":
            assert e.finished["B"].finish_reason.name == "ERROR"
        else:
            # Recomputed: its second load (a block allocated at the entry)
            # restores the state; the request runs to its end on right KV.
            assert len(loads) == 2 and not loads[1].refused and loads[1].keys
            assert e.finished["B"].finish_reason.name == "LENGTH"
            assert ("B", len(prompt)) in e.states
            assert b.num_computed_tokens >= len(prompt)
    finally:
        e.close()
