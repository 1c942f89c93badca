"""The sliding-window hybrid (e2e_common/hybrid_model.py: Mellum, one
sliding-window layer and one full-attention layer) on SGLang's CPU engine,
which keeps the sliding-window layer's KV in a pool of its own (SWAKVPool;
with HiCache, HybridCacheController and a host pool "swa" beside "kv"):

- HiCache over KvbmHiCacheStorage: the KV pool's pages move through the v1
  calls, the window's pages through the v2 calls, each pool under its own
  keys. After flush_cache() and in a fresh process on the same G4
  directory, a prompt's second run hits storage for both pools, generates
  the tokens of the engine without kvbm, and every page loaded, of either
  pool, holds the bytes stored under its key (recording_storage.py). A
  stale window state loaded under the right key fails that check.
- PD with kvbm's transfer backend: the decode generates the tokens of the
  engine without kvbm, from KV pages and sliding-window pages (SGLang hands
  the latter over as StateType.SWA) byte for byte as the prefill sent them
  (recording_pd.py).

Engines are started once per module (they dominate the suite's time)."""
import os

import pytest

from e2e_common.hybrid_model import WINDOW
from e2e_common.model import prompt
from sglang_helpers import HIT, PAGE, PAGES, Engine, Records, from_storage, \
    require_bytes_checked, require_handed_over, served, storage, wait_objects

#: The window's pages SGLang backs up and restores for a prompt.
SWA_PAGES = WINDOW // PAGE
BOTH = {"kv": PAGES, "swa": SWA_PAGES}


@pytest.fixture(scope="module")
def object_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("swa-g4"))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return Records(str(tmp_path_factory.mktemp("swa-records")))


def test_prefill_decode_hands_over_kv_and_window(swa_model_dir, tmp_path_factory,
                                                 swa_baseline):
    """First of the module, before its HiCache engine (first) is made: none
    idles beside the pair (an idle SGLang scheduler keeps polling)."""
    records = Records(str(tmp_path_factory.mktemp("swa-pd-records")))
    require_handed_over(swa_model_dir, records, "swa-", [prompt(40), prompt(41, 200)],
                        [2001, 2002], swa_baseline)


@pytest.fixture(scope="module")
def first(swa_model_dir, object_dir, records):
    e = Engine(swa_model_dir, records.path, "swa-hicache-1", hicache=storage(object_dir))
    yield e
    e.close()


def test_both_pools_served_from_storage_after_flush(first, records, swa_baseline):
    p, want = served(first, records, swa_baseline, 1, PAGES + SWA_PAGES)
    again = first.generate([p], 8)
    taken = records.take()
    assert again["tokens"] == want
    assert from_storage(again) == HIT, again["cached"]
    require_bytes_checked(records, taken, BOTH)


def test_a_stale_window_state_is_caught(first, records, swa_baseline):
    """The byte check sees a state of the right shape loaded under the
    right key from another prefix: every window page replaced, after
    kvbm's load, by a window page this engine stored under another key."""
    p, _ = served(first, records, swa_baseline, 2, PAGES + SWA_PAGES)
    flag = os.path.join(records.path, "break-stale-swa")
    open(flag, "w").close()
    try:
        first.generate([p], 8)
    finally:
        os.unlink(flag)
        first.call("flush")  # drop the stale state from SGLang's caches
    taken = records.take()
    loaded = [r for r in taken if r["ev"] == "loaded"]
    bad = [r for r in loaded if r["digest"] not in records.stored.get(r["key"], ())]
    assert {r["pool"] for r in bad} == {"swa"}, taken
    assert len(bad) == SWA_PAGES, taken


def test_fresh_process_on_the_same_object_dir(first, swa_model_dir, object_dir, records,
                                              swa_baseline):
    """Last of the module: a second engine process on the same G4 directory
    serves a prefix the first one stored, both pools from storage."""
    p, want = served(first, records, swa_baseline, 3, PAGES + SWA_PAGES)
    wait_objects(object_dir, len(records.stored))  # in G4 before the engine goes
    first.close()
    second = Engine(swa_model_dir, records.path, "swa-hicache-2", hicache=storage(object_dir))
    try:
        again = second.generate([p], 8)
        taken = records.take()
    finally:
        second.close()
    assert again["tokens"] == want
    assert from_storage(again) == HIT, again["cached"]
    require_bytes_checked(records, taken, BOTH)
