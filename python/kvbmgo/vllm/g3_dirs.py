"""The per-rank G3 directories of the vLLM connector: each worker makes its
own under the configured g3_dir (kvbm-rank<R>-pid<P>-…), and removes those
of processes that are gone; with g3_persist, a rank's directory is the same
every run (kvbm-persist-dp<D>-pp<P>-rank<R>), named by what its keys are
(persist_id)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from typing import Any, List

__all__ = ["make_g3_dir", "sweep_g3_dirs", "persistent_g3_dir", "persist_id"]

log = logging.getLogger(__name__)

_G3_DIR = re.compile(r"kvbm-rank\d+-pid(\d+)-")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True


def sweep_g3_dirs(g3_dir: str) -> List[str]:
    """Removes the per-rank directories under g3_dir of processes that are
    gone (a worker SIGKILLed before its shutdown ran). The G3 file in one
    has no name (libkvbm unlinks it as it opens it), so the disk space went
    back when the process died; this removes the empty directory left. A
    directory whose pid is alive (or is another process that reuses the
    pid) stays. Returns the paths removed."""
    removed = []
    try:
        names = os.listdir(g3_dir)
    except OSError:
        return removed
    for name in names:
        m = _G3_DIR.match(name)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        path = os.path.join(g3_dir, name)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
            log.info("kvbm: removed %s, the G3 directory of a process that is gone", path)
    return removed


def make_g3_dir(g3_dir: str, rank: int) -> str:
    """A fresh directory for rank's G3 under g3_dir (made 0700 if absent),
    after the directories of gone processes were swept."""
    os.makedirs(g3_dir, mode=0o700, exist_ok=True)
    sweep_g3_dirs(g3_dir)
    return tempfile.mkdtemp(prefix=f"kvbm-rank{rank}-pid{os.getpid()}-", dir=g3_dir)


def persistent_g3_dir(g3_dir: str, rank: str) -> str:
    """The G3 directory of rank (its data-parallel, pipeline and tensor
    ranks, e.g. "dp0-pp0-rank0") that outlives the engine (g3_persist),
    made 0700 if absent. The library locks the G3 file in it: one engine
    at a time."""
    path = os.path.join(g3_dir, f"kvbm-persist-{rank}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


#: The files of a model directory whose content the weights are.
_WEIGHT_FILES = re.compile(r".*\.(safetensors|bin|pt|pth|gguf)$|config\.json$")
#: Of each weight file, this many pieces of _SAMPLE bytes spread over it
#: are read: a fine-tuned model's weights differ everywhere, and a copy of
#: the directory (new modification times) is the same model.
_SAMPLES, _SAMPLE = 16, 64 << 10


def _file_digest(path: str, size: int) -> bytes:
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for i in range(_SAMPLES):
            f.seek(size * i // _SAMPLES)
            h.update(f.read(_SAMPLE))
    return h.digest()


def weights_id(model: str, revision: Any = None, download_dir: Any = None) -> str:
    """What the model's weights are, beyond its name: for a local directory
    a digest of its weight and config files (their names, sizes and pieces
    of their bytes: a directory whose weights were replaced is another
    model, a copy of it is the same); for a hub name the commit of the
    snapshot of that revision in vLLM's download directory or the hub's
    cache (a revision such as "main" that moved is another model), "unknown"
    when there is none (check_persistable warns)."""
    if os.path.isdir(model):
        h = hashlib.sha256()
        for name in sorted(os.listdir(model)):
            path = os.path.join(model, name)
            if _WEIGHT_FILES.match(name) and os.path.isfile(path):
                h.update(name.encode() + b"\0" + _file_digest(path, os.path.getsize(path)))
        return "files=" + h.hexdigest()[:16]
    try:
        from huggingface_hub import try_to_load_from_cache
        path = try_to_load_from_cache(model, "config.json", revision=revision,
                                      cache_dir=download_dir or None)
    except Exception:  # noqa: BLE001 - no hub, an odd name: the name is all we have
        path = None
    if isinstance(path, str):
        return "snapshot=" + os.path.basename(os.path.dirname(path))
    return "snapshot=unknown"


def check_persistable(vllm_config: Any) -> None:
    """Raises ValueError for a model whose KV cannot be kept across runs:
    fp8 KV with scales vLLM computes at its first forward (each run its
    own: the bytes kept would be read with other scales)."""
    mc, cc = vllm_config.model_config, vllm_config.cache_config
    if str(getattr(cc, "cache_dtype", "")).startswith("fp8") and \
            getattr(cc, "calculate_kv_scales", False):
        raise ValueError("kv_connector_extra_config['g3_persist']: the KV cache is "
                         f"{cc.cache_dtype} with calculate_kv_scales, whose scales each run "
                         f"computes anew, so KV kept on disk would be read with other "
                         f"scales; turn one of them off ({getattr(mc, 'model', '')})")


def persist_id(vllm_config: Any, groups: Any) -> str:
    """What a persistent G3's keys are, but for the rank and the G1 layout
    (the worker adds them): the model, its revision and its weights
    (weights_id), the dtypes, block size, parallel sizes and KV cache
    groups. vLLM's block hashes name tokens, not the model; a G3 kept under
    another id is not used."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    check_persistable(vllm_config)
    kinds = ",".join(f"{g.index}:{g.kind}" for g in groups.kept) if groups is not None else ""
    weights = weights_id(str(getattr(mc, "model", "")), getattr(mc, "revision", None),
                         getattr(getattr(vllm_config, "load_config", None), "download_dir", None))
    if weights.endswith("unknown"):
        log.warning("kvbm: g3_persist: the weights of %s are not found on disk, so the kept "
                    "KV is named by the model's name and revision only: a model replaced "
                    "under the same name would find it", getattr(mc, "model", ""))
    return (f"kvbm-vllm/2 model={getattr(mc, 'model', '')} "
            f"revision={getattr(mc, 'revision', None)} "
            f"weights={weights} dtype={getattr(mc, 'dtype', '')} "
            f"kv_cache_dtype={getattr(cc, 'cache_dtype', '')} block_size={cc.block_size} "
            f"tp={getattr(pc, 'tensor_parallel_size', 1)} "
            f"pp={getattr(pc, 'pipeline_parallel_size', 1)} groups={kinds}")
