"""kvbmgo.vllm: the vLLM (0.32, 0.33; SUPPORTED_VLLM) KV connector over kvbm's prefix cache, and
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

Supported vLLM releases: SUPPORTED_VLLM. 0.33 is tested against its
scheduler and worker pieces (tests/vllm_connector), 0.32 with real engines
of its CPU build (tests/e2e_vllm). Their KV connector interface is the same
for everything the connector uses: one code path, no shim needed so far.
"""

from .._lazy import lazy_attributes

#: vLLM minor releases the connector is tested with (connector.py warns on another).
SUPPORTED_VLLM = ("0.32", "0.33")

__all__ = ["SUPPORTED_VLLM", "KvbmConnector", "KvbmConnectorMetadata", "KvbmWorkerMetadata", "KvbmConfig"]

_WHERE = {
    "KvbmConnector": ".connector",
    "KvbmConnectorMetadata": ".metadata",
    "KvbmWorkerMetadata": ".metadata",
    "KvbmConfig": ".config",
}


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _WHERE)
