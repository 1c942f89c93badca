"""kvbmgo.vllm's extra config keys (pure Python: runs without vllm)."""
import os
import sys

import pytest

from kvbmgo.vllm.config import KvbmConfig, g1_access


def test_defaults_and_sizes():
    c = KvbmConfig.from_extra(None)
    assert (c.load_mode, c.g3_dir, c.g4_dir, c.admit_after) == ("sync", None, None, 0)
    assert c.tier_blocks(1 << 20) == (4096, 0)  # 4 GiB of 1 MiB blocks, no G3
    c = KvbmConfig.from_extra({"g2_blocks": 10, "g2_bytes": 1, "g3_dir": "/d", "g3_bytes": 5 << 20,
                               "other_connector_key": 1})
    assert c.tier_blocks(1 << 20) == (10, 5)
    assert KvbmConfig.from_extra({"load_mode": "async"}).async_load


def test_pd_defaults():
    c = KvbmConfig.from_extra(None)
    assert (c.pd_host, c.pd_port, c.pd_timeout_s, c.pd_hold_s, c.pd_max_pulls) == (
        "127.0.0.1", 5710, 30.0, 480.0, 8)
    assert c.worker_id is None  # derived from the engine id
    c = KvbmConfig.from_extra({"pd_timeout_s": 2, "pd_hold_s": 0.5, "pd_port": 6000})
    assert (c.pd_timeout_s, c.pd_hold_s, c.pd_port) == (2.0, 0.5, 6000)


@pytest.mark.parametrize("extra, what", [
    ({"g2_blocks": -1}, "g2_blocks"), ({"g2_blocks": 0}, "g2_blocks"),
    ({"admit_after": True}, "admit_after"), ({"g3_dir": ""}, "g3_dir"),
    ({"load_mode": "later"}, "load_mode"), ({"g2_bytes": "4G"}, "g2_bytes"),
    ({"pd_host": ""}, "pd_host"), ({"pd_port": 70000}, "pd_port"),
    ({"pd_timeout_s": 0}, "pd_timeout_s"), ({"pd_timeout_s": float("inf")}, "pd_timeout_s"),
    ({"pd_timeout_s": "30"}, "pd_timeout_s"), ({"pd_hold_s": -1}, "pd_hold_s"),
    ({"pd_max_pulls": 0}, "pd_max_pulls"), ({"load_policy": "sometimes"}, "load_policy"),
])
def test_bad_values_name_the_key(extra, what):
    with pytest.raises(ValueError, match=what):
        KvbmConfig.from_extra(extra)


def test_the_package_imports_without_vllm():
    import kvbmgo.vllm
    assert "KvbmConnector" in dir(kvbmgo.vllm)
    with pytest.raises(AttributeError):
        kvbmgo.vllm.NoSuchThing
    assert "vllm" not in sys.modules or hasattr(sys.modules["vllm"], "__version__")


@pytest.mark.parametrize("env,want", [
    ({}, ()),
    ({"KVBM_TRANSPORT": "tcp"}, ()),
    ({"KVBM_TRANSPORT": "ucx"}, ()),
    ({"KVBM_TRANSPORT": "ucx", "KVBM_UCX_ONE_SIDED": "1"}, ("REGISTERS",)),
    ({"KVBM_CUDA_IPC": "1"}, ("LEGACY_IPC",)),
    ({"KVBM_CUDA_IPC": "1", "KVBM_SAME_HOST": "0"}, ()),
    ({"KVBM_CUDA_IPC": "1", "KVBM_TRANSPORT": "ucx"}, ()),
    ({"KVBM_CUDA_IPC": "1", "KVBM_TRANSPORT": "ucx", "KVBM_UCX_ONE_SIDED": "1"}, ("REGISTERS",)),
    ({"KVBM_CUDA_IPC": "0"}, ()),
])
def test_g1_access_says_what_the_transports_do_with_g1(env, want):
    """vLLM 0.34's kv_cache_access flags: UCX's one-sided mode registers G1, same-host CUDA
    IPC exports it with cuIpcGetMemHandle, the staging path needs nothing."""
    assert g1_access(env) == want


def test_g3_persist_needs_a_directory_and_names_what_its_keys_are(tmp_path):
    assert KvbmConfig.from_extra(None).g3_persist is False
    assert KvbmConfig.from_extra({"g3_dir": "/d", "g3_persist": True}).g3_persist
    with pytest.raises(ValueError, match="g3_persist.*needs 'g3_dir'"):
        KvbmConfig.from_extra({"g3_persist": True})
    with pytest.raises(ValueError, match="g3_persist.*true or false"):
        KvbmConfig.from_extra({"g3_dir": "/d", "g3_persist": 1})
    from types import SimpleNamespace as NS
    from kvbmgo.vllm.g3_dirs import persist_id, persistent_g3_dir, sweep_g3_dirs

    def vc(model="m", dtype="bfloat16", tp=1):
        return NS(model_config=NS(model=model, revision=None, dtype=dtype),
                  cache_config=NS(cache_dtype="auto", block_size=16),
                  parallel_config=NS(tensor_parallel_size=tp, pipeline_parallel_size=1))
    ids = {persist_id(vc(), None), persist_id(vc(model="other"), None),
           persist_id(vc(dtype="float16"), None), persist_id(vc(tp=2), None)}
    assert len(ids) == 4, ids
    # A local model directory whose weights changed is another model.
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w" * (1 << 20))
    before = persist_id(vc(model=str(model)), None)
    assert persist_id(vc(model=str(model)), None) == before
    os.utime(model / "model.safetensors", (1, 1))  # a copy: other times, the same model
    assert persist_id(vc(model=str(model)), None) == before
    (model / "model.safetensors").write_bytes(b"w" * (1 << 19) + b"v" * (1 << 19))
    assert persist_id(vc(model=str(model)), None) != before, "other weights, the same size"
    assert "snapshot=" in persist_id(vc(model="org/not-in-any-cache"), None)
    # fp8 KV whose scales each run computes cannot be kept.
    fp8 = vc()
    fp8.cache_config = NS(cache_dtype="fp8_e4m3", block_size=16, calculate_kv_scales=True)
    with pytest.raises(ValueError, match="calculate_kv_scales"):
        persist_id(fp8, None)
    fp8.cache_config.calculate_kv_scales = False
    assert "kv_cache_dtype=fp8_e4m3" in persist_id(fp8, None)
    d = persistent_g3_dir(str(tmp_path), "dp0-pp1-rank3")
    assert d == str(tmp_path / "kvbm-persist-dp0-pp1-rank3") and os.path.isdir(d)
    assert sweep_g3_dirs(str(tmp_path)) == [] and os.path.isdir(d)
