"""kvbmgo.vllm: the vLLM (0.32 to 0.34; SUPPORTED_VLLM) KV connector over kvbm's prefix cache, and
disaggregated prefill->decode (kv_role kv_producer / kv_consumer / kv_both,
NixlConnector's kv_transfer_params; see pd_wire.py, pd_prefill.py and pd_decode.py).

vLLM loads it with::

    --kv-transfer-config '{"kv_connector": "KvbmConnector",
                           "kv_connector_module_path": "kvbmgo.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {...}}'

Importing this package imports neither vllm nor torch and does not load
libkvbm.so: vLLM imports connector classes in its config process and may
fork workers afterwards. The classes are built on first attribute access
(vLLM's factory does ``getattr(module, "KvbmConnector")``), which imports
vllm; the library loads when a worker-side connector registers its KV caches.

Supported vLLM releases: SUPPORTED_VLLM. 0.33 and 0.34 are tested against
their scheduler and worker pieces (tests/vllm_connector), 0.32 with real
engines of its CPU build (tests/e2e_vllm). One code path for all three:
where they differ (0.34 re-sends a resumed request whole in
scheduled_new_reqs and drops CachedRequestData.resumed_req_ids), the
connector feature-detects, never compares versions.
"""

from .._lazy import lazy_attributes

#: vLLM minor releases the connector is tested with (connector.py warns on another).
SUPPORTED_VLLM = ("0.32", "0.33", "0.34")

__all__ = ["SUPPORTED_VLLM", "KvbmConnector", "KvbmConnectorMetadata", "KvbmWorkerMetadata", "KvbmConfig"]

_WHERE = {
    "KvbmConnector": ".connector",
    "KvbmConnectorMetadata": ".metadata",
    "KvbmWorkerMetadata": ".metadata",
    "KvbmConfig": ".config",
}


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _WHERE)
