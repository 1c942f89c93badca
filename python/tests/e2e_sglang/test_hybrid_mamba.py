"""The Mamba-kind hybrid (e2e_common/hybrid_model.py: LFM2, a
short-convolution layer beside a full-attention layer) on SGLang's CPU
engine (sglang_helpers.MAMBA_ENGINE; the convolution through the torch
stand-in of standins/cpu_short_conv.py), with HiCache over
KvbmHiCacheStorage: HybridCacheController moves the KV pool's pages
through the v1 calls and the Mamba pool's states (one per request, the
conv state at its end, hit policy TRAILING_PAGES) through the v2 calls.

SGLang keeps a Mamba state where a request ended only (no_buffer), so a
prompt's state is usable by a longer prompt that extends it: the tests
serve a prompt, flush SGLang's caches, and serve it extended: its prefix
comes from storage, the KV pages and the state, and every page loaded, of
either pool, holds the bytes stored under its key (recording_storage.py);
the tokens are those of the engine without kvbm. A stale state (another
prompt's) loaded under the right key fails that check."""
import os

import pytest

from e2e_common.model import prompt
from sglang_helpers import MAMBA_ENGINE, PROMPT_TOKENS, Engine, Records, flush, from_storage, \
    require_bytes_checked, require_handed_over, served, storage, wait_objects

#: Pages of one token: the prompt's KV pages and its state.
LOADED = {"kv": PROMPT_TOKENS, "mamba": 1}
STORED = PROMPT_TOKENS + 1


def mamba_storage(object_dir):
    # SGLang backs up 128 one-token pages a call: G2 holds several calls
    return dict(storage(object_dir), g2_pages=2048)


@pytest.fixture(scope="module")
def object_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("mamba-g4"))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return Records(str(tmp_path_factory.mktemp("mamba-records")))


def test_prefill_decode_hands_over_kv_and_state(lfm2_model_dir, tmp_path_factory,
                                                lfm2_baseline):
    """First of the module, before its HiCache engine (first) is made: none
    idles beside the pair (an idle SGLang scheduler keeps polling)."""
    records = Records(str(tmp_path_factory.mktemp("mamba-pd-records")))
    require_handed_over(lfm2_model_dir, records, "mamba-", [prompt(50), prompt(51, 200)],
                        [3001, 3002], lfm2_baseline, MAMBA_ENGINE)


@pytest.fixture(scope="module")
def first(lfm2_model_dir, object_dir, records):
    e = Engine(lfm2_model_dir, records.path, "mamba-hicache-1",
               hicache=mamba_storage(object_dir), engine=MAMBA_ENGINE)
    yield e
    e.close()


def extended(p, seed):
    return p + prompt(100 + seed, 20)


def test_kv_and_state_served_from_storage_after_flush(first, records, lfm2_baseline):
    p, _ = served(first, records, lfm2_baseline, 1, STORED)
    longer = extended(p, 1)
    again = first.generate([longer], 8)
    taken = records.take()
    assert again["tokens"] == lfm2_baseline([longer], 8)
    assert from_storage(again) == PROMPT_TOKENS, again["cached"]
    require_bytes_checked(records, taken, LOADED)


def test_a_stale_mamba_state_is_caught(first, records, lfm2_baseline):
    """The byte check sees a state of the right shape loaded under the
    right key from another prompt: after kvbm's load, the state is replaced
    by a state this engine stored under another key."""
    p, _ = served(first, records, lfm2_baseline, 2, STORED)
    flag = os.path.join(records.path, "break-stale-mamba")
    open(flag, "w").close()
    try:
        again = first.generate([extended(p, 2)], 8)
    finally:
        os.unlink(flag)
        flush(first)  # drop the stale state from SGLang's caches
    taken = records.take()
    loaded = [r for r in taken if r["ev"] == "loaded"]
    bad = [r for r in loaded if r["digest"] not in records.stored.get(r["key"], ())]
    assert [r["pool"] for r in bad] == ["mamba"], taken
    print(f"stale Mamba state: tokens equal: "
          f"{again['tokens'] == lfm2_baseline([extended(p, 2)], 8)}")


def test_fresh_process_on_the_same_object_dir(first, lfm2_model_dir, object_dir, records,
                                              lfm2_baseline):
    """Last of the module: a second engine process on the same G4 directory
    serves the extension of a prompt the first one stored, its KV pages
    and its state from storage."""
    p, _ = served(first, records, lfm2_baseline, 3, STORED)
    wait_objects(object_dir, len(records.stored))  # in G4 before the engine goes
    first.close()
    second = Engine(lfm2_model_dir, records.path, "mamba-hicache-2",
                    hicache=mamba_storage(object_dir), engine=MAMBA_ENGINE)
    longer = extended(p, 3)
    try:
        again = second.generate([longer], 8)
        taken = records.take()
    finally:
        second.close()
    assert again["tokens"] == lfm2_baseline([longer], 8)
    assert from_storage(again) == PROMPT_TOKENS, again["cached"]
    require_bytes_checked(records, taken, LOADED)
