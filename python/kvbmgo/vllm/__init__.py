"""kvbmgo.vllm: the vLLM (0.33) KV connector over kvbm's prefix cache, and
disaggregated prefill->decode (kv_role kv_producer / kv_consumer / kv_both,
NixlConnector's kv_transfer_params; see disagg.py).

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
"""

from .._lazy import lazy_attributes

__all__ = ["KvbmConnector", "KvbmConnectorMetadata", "KvbmWorkerMetadata", "KvbmConfig"]

_WHERE = {
    "KvbmConnector": ".connector",
    "KvbmConnectorMetadata": ".metadata",
    "KvbmWorkerMetadata": ".metadata",
    "KvbmConfig": ".config",
}


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _WHERE)
