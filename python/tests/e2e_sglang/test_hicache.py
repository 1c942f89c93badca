"""A real SGLang engine (CPU) with HiCache over KvbmHiCacheStorage, against
the same engine without HiCache: tokens equal, SGLang reports the prefix's
tokens as coming from storage, and every page kvbm loaded holds the bytes
stored under its key (recording_storage.py): after flush_cache() in the same
process, and in a fresh process on the same G4 (object) directory."""
import os

import pytest

from sglang_helpers import HIT, PAGES, Engine, Records, from_storage, require_bytes_checked, \
    served, storage, wait_objects


@pytest.fixture(scope="module")
def object_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("g4"))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return Records(str(tmp_path_factory.mktemp("records")))


@pytest.fixture(scope="module")
def first(model_dir, object_dir, records):
    e = Engine(model_dir, records.path, "hicache-1", hicache=storage(object_dir))
    yield e
    e.close()


def test_served_from_storage_after_flush(first, records, baseline):
    p, want = served(first, records, baseline, 1, PAGES)
    again = first.generate([p], 8)
    taken = records.take()
    assert again["tokens"] == want
    assert from_storage(again) == HIT, again["cached"]
    require_bytes_checked(records, taken, PAGES)


def test_broken_connector_is_caught(first, records, baseline):
    """The byte check sees what tokens may not: a load that puts the pages of
    a batch into SGLang's host pages in reversed order."""
    p, want = served(first, records, baseline, 2, PAGES)
    flag = os.path.join(records.path, "break-reverse")
    open(flag, "w").close()
    try:
        again = first.generate([p], 8)
    finally:
        os.unlink(flag)
        first.call("flush")  # drop the wrong KV from SGLang's caches
    taken = records.take()
    loaded = [r for r in taken if r["ev"] == "loaded"]
    bad = [r for r in loaded if r["digest"] not in records.stored.get(r["key"], ())]
    assert loaded and bad, taken
    print(f"broken connector: tokens equal: {again['tokens'] == want}; pages with wrong "
          f"bytes: {len(bad)} of {len(loaded)}")


def test_fresh_process_on_the_same_object_dir(first, model_dir, object_dir, records,
                                              baseline):
    """Last of the module: a second engine process on the same G4 directory
    serves a prefix the first one stored, from storage, the first closed."""
    p, want = served(first, records, baseline, 3, PAGES)
    wait_objects(object_dir, len(records.stored))  # in G4 before the engine goes
    first.close()
    second = Engine(model_dir, records.path, "hicache-2", hicache=storage(object_dir))
    try:
        again = second.generate([p], 8)
        taken = records.take()
    finally:
        second.close()
    assert again["tokens"] == want
    assert from_storage(again) == HIT, again["cached"]
    require_bytes_checked(records, taken, PAGES)
