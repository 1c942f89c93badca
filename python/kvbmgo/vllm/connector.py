"""KvbmConnector: the class vLLM loads. A facade: it builds the scheduler
side (scheduler.py) or the worker side (worker.py) from its role and
forwards each call; the metadata between them is in metadata.py."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Iterable, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                               KVConnectorMetadata,
                                                               KVConnectorRole, SupportsHMA)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from . import SUPPORTED_VLLM
from .config import KvbmConfig, g1_access
from .groups import KvGroups
from .metadata import KvbmConnectorMetadata

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = ["KvbmConnector"]

log = logging.getLogger(__name__)


def _check_vllm_version() -> None:
    import vllm
    v = str(getattr(vllm, "__version__", ""))
    if ".".join(v.split(".")[:2]) not in SUPPORTED_VLLM:
        log.warning("KvbmConnector: vLLM %s is not one it is tested with (%s)", v,
                    ", ".join(SUPPORTED_VLLM))


_check_vllm_version()


def _rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return int(get_tensor_model_parallel_rank())
    except Exception:  # noqa: BLE001 - no TP group (a test, one process)
        return 0


def _pp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_pp_group
        return int(get_pp_group().rank_in_group)
    except Exception:  # noqa: BLE001 - no PP group (a test, one process)
        return 0


def _dp_index(parallel_config: Any) -> int:
    """The data-parallel rank that picks this engine's side-channel ports
    (NixlConnector adds the same to its port)."""
    return int(getattr(parallel_config, "data_parallel_index", 0) or 0)


def _kv_heads(vllm_config: Any) -> "tuple[int, bool]":
    """(the model's KV heads over all ranks, whether it is MLA): what a
    decode maps heads from a prefill of another TP size with (0: unknown)."""
    mc = getattr(vllm_config, "model_config", None)
    try:
        return int(mc.get_total_num_kv_heads()), bool(mc.use_mla)
    except Exception:  # noqa: BLE001 - no model config (a test): rank to rank only
        return 0, False


class KvbmConnector(KVConnectorBase_V1, SupportsHMA):
    """kvbm's prefix cache (G2 pinned host memory, G3 disk, G4 object store)
    under vLLM's KV cache, and disaggregated prefill->decode: a
    ``kv_producer`` (or ``kv_both``) instance holds a finished prefill
    request's blocks for a ``kv_consumer`` (or ``kv_both``) instance, which
    pulls them, with NixlConnector's kv_transfer_params.

    SupportsHMA: vLLM keeps its hybrid KV cache manager on. A model with
    full-attention and sliding-window groups is cached per group
    (groups.py); one with a group kvbm cannot keep yet (Mamba / linear
    attention) runs with nothing cached, saying so once; P/D needs one group."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "Optional[KVCacheConfig]" = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        kt = vllm_config.kv_transfer_config
        if kt.kv_role not in ("kv_both", "kv_producer", "kv_consumer"):
            raise ValueError(f"KvbmConnector: kv_role {kt.kv_role!r}; expected 'kv_both', "
                             f"'kv_producer' or 'kv_consumer'")
        self.config = KvbmConfig.from_extra(kt.kv_connector_extra_config)
        self.groups = KvGroups.from_config(kv_cache_config, vllm_config.cache_config.block_size)
        pc = vllm_config.parallel_config
        tp = int(pc.tensor_parallel_size)
        engine_id = str(kt.engine_id)
        self._scheduler = None
        self._worker = None
        if role == KVConnectorRole.SCHEDULER:
            from .scheduler import KvbmScheduler
            self._scheduler = KvbmScheduler(self.config, vllm_config.cache_config.block_size,
                                            role=kt.kv_role, engine_id=engine_id, tp_size=tp,
                                            dp_index=_dp_index(pc), groups=self.groups)
        else:
            from .worker import KvbmWorker
            heads, mla = _kv_heads(vllm_config)
            from .g3_dirs import persist_id
            self._worker = KvbmWorker(self.config, rank=_rank(), role=kt.kv_role,
                                      engine_id=engine_id, tp_size=tp,
                                      dp_index=_dp_index(pc), kv_heads=heads, mla=mla,
                                      groups=self.groups,
                                      persist_id=persist_id(vllm_config, self.groups)
                                      if self.config.g3_persist else None,
                                      pp_rank=_pp_rank())

    # ---- scheduler side

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> "tuple[int | None, bool]":
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def on_new_request(self, request: Any) -> None:
        self._scheduler.on_new_request(request)

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: "list[int]"
                         ) -> "tuple[bool, dict[str, Any] | None]":
        return self._scheduler.request_finished(request, block_ids)

    def request_finished_all_groups(self, request: Any, block_ids: "tuple[list[int], ...]"
                                    ) -> "tuple[bool, dict[str, Any] | None]":
        return self._scheduler.request_finished_all_groups(request, block_ids)

    def get_loaded_kv_cache_group_ids(self, request: Any) -> "tuple[int, ...]":
        """The groups a load fills: every kept group's blocks of the hit
        (a sliding window's within the window). With one group, vLLM's default."""
        if not self.groups.hybrid:
            return super().get_loaded_kv_cache_group_ids(request)
        return tuple(g.index for g in self.groups.kept)

    def update_connector_output(self, connector_output: Any) -> None:
        self._scheduler.update_connector_output(connector_output)

    def take_events(self) -> Iterable[Any]:
        return self._scheduler.take_events()

    def reset_cache(self) -> bool:
        return self._scheduler.reset_cache()

    # ---- worker side

    def register_kv_caches(self, kv_caches: "dict[str, Any]") -> None:
        self._worker.register_kv_caches(kv_caches)

    def unregister_kv_caches(self) -> None:
        # Sleep mode or a weight update lends the KV cache's memory away.
        if self._worker is not None:
            self._worker.unregister_kv_caches()

    def restore_kv_caches(self) -> None:
        if self._worker is not None:
            self._worker.restore_kv_caches()

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        """unregister_kv_caches lets go of the KV cache's memory (every
        transfer on it over, every registration and capability of it
        withdrawn) and restore_kv_caches registers it again; but not with
        same-host CUDA IPC (KVBM_CUDA_IPC=1): a decode that opened G1 keeps
        the allocation mapped until its next pull is refused, which sleep
        cannot wait for."""
        return "LEGACY_IPC" not in g1_access(os.environ)

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: Any) -> Any:
        """vLLM 0.34: how kvbm reaches G1 (config.g1_access): IN_PROCESS
        unless UCX registers it (REGISTERS) or same-host CUDA IPC exports it
        (LEGACY_IPC, which keeps vLLM's extensible KV cache off)."""
        from vllm.config.kv_transfer import KVCacheAccess
        access = KVCacheAccess.IN_PROCESS
        for name in g1_access(os.environ):
            access |= KVCacheAccess[name]
        return access

    def _md(self) -> KvbmConnectorMetadata:
        md = self._get_connector_metadata()
        assert isinstance(md, KvbmConnectorMetadata)
        return md

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None:
            self._worker.bind()

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        if isinstance(kv_connector_metadata, KvbmConnectorMetadata):
            self._worker.handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._worker.start_load_kv(self._md())

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        # Stores go whole blocks (every layer) at wait_for_save: one call per
        # step instead of one per layer, and the block ids come from our own
        # metadata, not from attn_metadata (whose shape differs per backend).
        pass

    def wait_for_save(self) -> None:
        self._worker.wait_for_save(self._md())

    def get_finished(self, finished_req_ids: "set[str]"
                     ) -> "tuple[set[str] | None, set[str] | None]":
        return self._worker.get_finished()

    def get_transfer_results(self, finished_req_ids: "set[str]") -> Any:
        """get_finished, and with several KV cache groups the loads that
        failed, by request (vLLM takes no block ids then)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.base import \
            KVConnectorTransferResults
        # Through get_finished, as vLLM's default does: a subclass that
        # wraps it (the real-engine tests' recording one) sees every result.
        sending, recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(finished_sending=set(sending or ()),
                                          finished_recving=set(recving or ()),
                                          failed_recving=self._worker.take_failed_recving())

    def get_block_ids_with_load_errors(self) -> "set[int]":
        return self._worker.get_block_ids_with_load_errors()

    def build_connector_worker_meta(self) -> Any:
        return self._worker.build_worker_meta()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()

    # ---- stats (both sides) and metrics

    def get_kv_connector_stats(self) -> Any:
        if self._worker is not None:
            return self._worker.get_stats()
        return self._scheduler.take_stats()

    @classmethod
    def build_kv_connector_stats(cls, data: "Optional[dict[str, Any]]" = None) -> Any:
        from .stats import KvbmConnectorStats
        return KvbmConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig", metric_types: "dict[type, type]",
                           labelnames: "list[str]",
                           per_engine_labelvalues: "dict[int, list[object]]") -> Any:
        from .stats import KvbmPromMetrics
        return KvbmPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
