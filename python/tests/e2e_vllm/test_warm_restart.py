"""A warm restart (g3_persist): an engine serves a prefix, is SIGKILLed, and
a new engine on the same directory finds the prefix in G3 (tokens equal,
every loaded byte what was stored under its key, even across the kill);
a G3 file whose bytes changed is refused (recomputed, never loaded); and
another model on the same directory finds nothing."""
import os
import shutil
import signal
import time

import pytest

from e2e_helpers import BLOCK, Engine, prompt, records, require_bytes_checked

HIT = (300 - 1) // BLOCK * BLOCK   # 288 tokens: the prompt's whole blocks


def _wait(engine, pred, what, timeout=60.0):
    """The rank-0 cache stats once pred holds (the restore runs in the
    background)."""
    deadline = time.monotonic() + timeout
    while True:
        st = engine.call("stats")["stats"][0]
        if pred(st):
            return st
        assert time.monotonic() < deadline, f"{what}: {st}"
        time.sleep(0.2)


def _kill(engine):
    os.kill(engine.pid, signal.SIGKILL)
    engine.p.wait(30)


@pytest.fixture
def warm(tmp_path, monkeypatch):
    """The connector config of a persistent G3 under tmp_path, and the file
    the recording connector keeps its digests in across processes."""
    monkeypatch.setenv("KVBM_E2E_VERSIONS", str(tmp_path / "digests"))
    return {"g2_blocks": 24, "g3_dir": str(tmp_path / "g3"), "g3_blocks": 96,
            "g3_mode": "write_through", "g3_persist": True, "load_mode": "sync"}


def test_a_prefix_survives_sigkill_and_nothing_wrong_is_loaded(model_dir, baseline, warm,
                                                               tmp_path):
    p = prompt(21)
    want = baseline([p], 8)
    a = Engine(model_dir, warm, name="warm-a")
    try:
        assert a.generate([p], 8)["tokens"] == want
        _wait(a, lambda st: st["g3"]["registered"] >= HIT // BLOCK, "G3 written")
    finally:
        _kill(a)
    rank_dir = os.path.join(warm["g3_dir"], "kvbm-persist-dp0-pp0-rank0")
    assert sorted(os.listdir(rank_dir)) == ["kvbm-g3.blocks", "kvbm-g3.journal"]

    # A new engine, same model and directory: the prefix is a G3 hit.
    b = Engine(model_dir, warm, name="warm-b")
    try:
        st = _wait(b, lambda st: st["g3_restored"] + st["g3_refused"] >= HIT // BLOCK,
                   "restored")
        assert st["g3_refused"] == 0 and st["g3_restored"] >= HIT // BLOCK, st
        # Some steps first: the scheduler hears of the restored keys from
        # the worker's events.
        b.generate([prompt(99, 40)], 1)
        again = b.generate([p], 8)
        assert again["tokens"] == want
        assert [r["tokens"] for r in records(again, "external")] == [HIT]
        require_bytes_checked(again, HIT // BLOCK)
        assert b.call("stats")["stats"][0]["onboarded_from_g3"] >= HIT // BLOCK
    finally:
        _kill(b)

    # Every block's bytes changed on disk: none is restored, the prefix is
    # recomputed, tokens equal.
    path = os.path.join(rank_dir, "kvbm-g3.blocks")
    with open(path, "r+b") as f:
        size = os.path.getsize(path)
        for off in range(0, size, 4096):
            f.seek(off)
            byte = f.read(1)
            f.seek(off)
            f.write(bytes([byte[0] ^ 0x5A]))
    c = Engine(model_dir, warm, name="warm-c")
    try:
        st = _wait(c, lambda st: st["g3_restored"] + st["g3_refused"] >= HIT // BLOCK,
                   "refused")
        assert st["g3_restored"] == 0, st
        c.generate([prompt(99, 40)], 1)
        ans = c.generate([p], 8)
        assert ans["tokens"] == want
        assert records(ans, "external") == [], ans["records"]
    finally:
        c.close()

    # Another model (the same weights under another name: another id) on
    # the same directory finds nothing.
    other = str(tmp_path / "other-model")
    shutil.copytree(model_dir, other)
    d = Engine(other, warm, name="warm-d")
    try:
        ans = d.generate([p], 8)
        assert ans["tokens"] == want
        assert records(ans, "external") == [], ans["records"]
        assert d.call("stats")["stats"][0]["g3_restored"] == 0
    finally:
        d.close()
