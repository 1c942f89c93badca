"""kvbmgo.sglang: SGLang (0.5.23) adapters over kvbm.

HiCache loads the storage backend with::

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvbm",
        "module_path": "kvbmgo.sglang", "class_name": "KvbmHiCacheStorage",
        "interface_v1": 1, "disk_dir": "/nvme/kvbm", "g3_pages": 4096}'

(the keys of ``KvbmHiCacheConfig`` may be given there too).

PD disaggregation over kvbm (``KvbmKVManager``, ``KvbmKVSender``,
``KvbmKVReceiver``, ``KvbmKVBootstrapServer``; see ``kvbmgo.sglang.pd``)::

    --disaggregation-mode prefill|decode --disaggregation-transfer-backend kvbm

which SGLang accepts once the ``kvbm`` plugin (entry point group
``sglang.srt.plugins``, ``kvbmgo.sglang.plugin:register``) is installed.

Importing this package imports neither sglang nor torch and does not load
libkvbm.so: SGLang imports backend classes before it forks its scheduler
processes. The classes are built on first attribute access (SGLang's
factory does ``getattr(module, class_name)``), which imports sglang; the
library loads when the backend registers SGLang's host pool.
"""

from .._lazy import lazy_attributes

__all__ = ["KvbmHiCacheStorage", "KvbmHiCacheConfig", "HostPoolLayout", "host_pool_layout",
           "KvbmKVManager", "KvbmKVSender", "KvbmKVReceiver", "KvbmKVBootstrapServer"]

_WHERE = {
    "KvbmHiCacheStorage": ".hicache",
    "KvbmHiCacheConfig": ".config",
    "HostPoolLayout": ".host_pool",
    "host_pool_layout": ".host_pool",
    "KvbmKVManager": ".pd",
    "KvbmKVSender": ".pd",
    "KvbmKVReceiver": ".pd",
    "KvbmKVBootstrapServer": ".pd",
}


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _WHERE)
