"""The settings of the kvbm HiCache storage backend, read from SGLang's
``--hicache-storage-backend-extra-config``."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Optional

__all__ = ["KvbmHiCacheConfig", "namespace_of"]

# Keys of extra_config that SGLang itself reads (the dynamic loader's, the
# controller's); everything else must be ours.
# (file_storage_path: SGLang adds --file-storage-path to a hybrid model's extra_config.)
_SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size",
                "file_storage_path"}

#: Settings a host pool of a hybrid model may have of its own.
_POOL_KEYS = {"g2_pages", "g3_pages"}


@dataclass(frozen=True)
class KvbmHiCacheConfig:
    """What kvbm adds under SGLang's host pool (kvbm's G1 in these terms).

    interface_v1: SGLang moves pages through ``batch_*_v1`` and the host
    pool itself is registered with kvbm (zero copy). Otherwise SGLang calls
    the copying ``get``/``set``/``batch_*`` with flat pages, staged through
    ``staging_pages`` pages of kvbm-registered memory.
    """
    interface_v1: bool = False
    #: kvbm's own pinned G2, in pages (0: two batches of SGLang's, 256)
    g2_pages: int = 0
    #: G3 directory (a file of g3_pages pages); None: no G3
    disk_dir: Optional[str] = None
    g3_pages: int = 0
    #: G4 filesystem store; None: none
    object_dir: Optional[str] = None
    #: when pages are written down (kvbmgo.WriteMode names)
    g3_mode: str = "auto"
    g4_mode: str = "auto"
    #: pages staged at once by the copying path
    staging_pages: int = 16
    #: kvbm worker id; 0: derived from the process id and the ranks
    worker_id: int = 0
    #: kvbm device ordinal (the emulated device under KVBM_DEVICE=emulated)
    device_id: int = 0
    #: per host pool of a hybrid model (HiCache storage v2), by SGLang's pool
    #: name: {"mamba": {"g2_pages": 8, "g3_pages": 256}}. Unnamed pools: G2
    #: of min(32, the pool's pages) pages (a state can be megabytes), G3 of
    #: g3_pages.
    pools: Optional[Mapping[str, Mapping[str, int]]] = None
    #: Load or recompute (kvbm_load_plan): auto, a hit query answers only as
    #: far as loading is expected to end before recomputing would, by the
    #: tiers' measured rates and the prefill rate; always: every page held
    #: is a hit.
    load_policy: str = "auto"
    #: The engine's prefill rate in tokens per second; 0: learned from the
    #: pages SGLang computes after a miss (prefill_rate.py). Until it is
    #: known every page held is a hit.
    prefill_tokens_per_s: float = 0.0

    @classmethod
    def from_extra_config(cls, extra: Optional[Mapping[str, Any]]) -> "KvbmHiCacheConfig":
        """Reads the backend's keys of extra_config. Raises ValueError naming
        an unknown key or a bad value."""
        extra = dict(extra or {})
        known = {f.name for f in dataclasses.fields(cls)}
        values = {}
        for k, v in extra.items():
            if k in known:
                values[k] = v
            elif k not in _SGLANG_KEYS:
                raise ValueError(f"kvbm HiCache storage: unknown extra_config key {k!r} "
                                 f"(known: {sorted(known - {'interface_v1'})})")
        c = cls(**values)
        for name in ("g2_pages", "g3_pages", "staging_pages", "worker_id", "device_id"):
            v = getattr(c, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"kvbm HiCache storage: {name} must be an integer >= 0, "
                                 f"got {v!r}")
        p = c.prefill_tokens_per_s
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not p >= 0 or \
                p == float("inf"):
            raise ValueError(f"kvbm HiCache storage: prefill_tokens_per_s must be a number "
                             f">= 0, got {p!r}")
        if c.load_policy not in ("auto", "always"):
            raise ValueError(f"kvbm HiCache storage: load_policy must be 'auto' or 'always', "
                             f"got {c.load_policy!r}")
        if c.staging_pages < 1:
            raise ValueError("kvbm HiCache storage: staging_pages must be at least 1")
        if c.disk_dir and c.g3_pages < 1:
            raise ValueError("kvbm HiCache storage: disk_dir needs g3_pages >= 1 (G3's size)")
        if c.pools is not None:
            if not isinstance(c.pools, Mapping):
                raise ValueError(f"kvbm HiCache storage: pools must map a pool name to its "
                                 f"settings, got {c.pools!r}")
            for name, settings in c.pools.items():
                if not isinstance(settings, Mapping) or set(settings) - _POOL_KEYS:
                    raise ValueError(f"kvbm HiCache storage: pools[{name!r}] takes "
                                     f"{sorted(_POOL_KEYS)}, got {settings!r}")
                for k, v in settings.items():
                    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                        raise ValueError(f"kvbm HiCache storage: pools[{name!r}][{k!r}] must "
                                         f"be an integer >= 1, got {v!r}")
        return dataclasses.replace(c, interface_v1=bool(c.interface_v1))


def namespace_of(storage_config: Any, layout: str, page_size: int, dtype_width: int) -> bytes:
    """The key namespace of one rank: pages of different models, tensor,
    pipeline, context or data-parallel ranks (SGLang's dp_rank tells apart
    attention groups), host layouts or page shapes never share a key. MLA
    KV is the same on every tensor rank (of one decode-context shard), so
    MLA leaves the tensor rank out."""
    c = storage_config
    mla = bool(getattr(c, "is_mla_model", False))
    parts = [
        "sglang-hicache-v1",
        f"model={getattr(c, 'model_name', None) or ''}",
        f"tp={'*' if mla else getattr(c, 'tp_rank', 0)}/{getattr(c, 'tp_size', 1)}",
        f"pp={getattr(c, 'pp_rank', 0)}/{getattr(c, 'pp_size', 1)}",
        f"cp={getattr(c, 'attn_cp_rank', 0)}/{getattr(c, 'attn_cp_size', 1)}",
        f"dcp={getattr(c, 'dcp_rank', 0)}/{getattr(c, 'dcp_size', 1)}",
        f"dp={getattr(c, 'dp_rank', 0)}",
        f"layout={layout}", f"page={page_size}", f"width={dtype_width}",
        f"mla={int(mla)}",
    ]
    return hashlib.sha256("|".join(parts).encode()).digest()
