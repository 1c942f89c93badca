"""kvbmgo.sglang without sglang: the import stays lazy and the backend's
settings are checked before anything is built (the backend itself is tested
with the real sglang under tests/sglang, `make test-sglang`)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvbmgo.sglang import KvbmHiCacheConfig


def test_import_loads_nothing_heavy():
    code = ("import sys\n"
            "import kvbmgo.sglang as m\n"
            "assert 'torch' not in sys.modules and 'sglang' not in sys.modules\n"
            "assert 'libkvbm' not in open('/proc/self/maps').read()\n"
            "assert 'KvbmHiCacheStorage' in dir(m)\n"
            "m.KvbmHiCacheConfig.from_extra_config({'interface_v1': 1})\n"
            "assert 'libkvbm' not in open('/proc/self/maps').read()\n"
            "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_config_from_extra_config():
    c = KvbmHiCacheConfig.from_extra_config({
        "backend_name": "kvbm", "module_path": "kvbmgo.sglang",
        "class_name": "KvbmHiCacheStorage", "interface_v1": 1, "tp_lcm_size": 2,
        "disk_dir": "/d", "g3_pages": 8, "g2_pages": 4})
    assert (c.interface_v1, c.disk_dir, c.g3_pages, c.g2_pages) == (True, "/d", 8, 4)
    assert KvbmHiCacheConfig.from_extra_config(None) == KvbmHiCacheConfig()


@pytest.mark.parametrize("extra, match", [
    ({"g2_page": 1}, "unknown extra_config key 'g2_page'"),
    ({"g2_pages": -1}, "g2_pages must be an integer >= 0"),
    ({"g3_pages": True}, "g3_pages must be an integer"),
    ({"staging_pages": 0}, "staging_pages must be at least 1"),
    ({"disk_dir": "/d"}, "disk_dir needs g3_pages"),
    ({"prefill_tokens_per_s": -1}, "prefill_tokens_per_s must be a number >= 0"),
    ({"prefill_tokens_per_s": "fast"}, "prefill_tokens_per_s must be a number"),
    ({"prefill_tokens_per_s": float("nan")}, "prefill_tokens_per_s must be a number"),
    ({"load_policy": "sometimes"}, "load_policy must be"),
])
def test_config_refusals(extra, match):
    with pytest.raises(ValueError, match=match):
        KvbmHiCacheConfig.from_extra_config(extra)


def test_unknown_attribute():
    import kvbmgo.sglang
    with pytest.raises(AttributeError):
        kvbmgo.sglang.NoSuchThing  # noqa: B018
