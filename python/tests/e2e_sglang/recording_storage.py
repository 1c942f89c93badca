"""RecordingKvbmHiCacheStorage: KvbmHiCacheStorage with a byte check, for the
SGLang real-engine tests (SGLang loads it as a "dynamic" HiCache storage
backend, module_path "recording_storage").

Tokens alone cannot see a page-mapping bug: a prefix's pages swapped among
themselves give the same attention, hence the same tokens. So every page
kvbm stored (batch_set_v1 answered True) is recorded with the digest of its
bytes in SGLang's host pool under its SGLang key, and every page kvbm loaded
(batch_get_v1 answered True) with the digest of what landed in the host page
SGLang asked for. The test compares them: a loaded page must hold bytes
stored under its key, by this process or an earlier one on the same object
directory.

Records are JSON lines in $KVBM_E2E_RECORDS/records-<pid>.jsonl (the storage
runs in SGLang's scheduler process, not the test's). The deliberately broken
connector, which the byte check must catch: a file "break-reverse" in that
directory (or KVBM_E2E_BREAK=reverse) makes a load put a batch's pages into
SGLang's host pages in reversed order."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any, List

from kvbmgo.sglang import KvbmHiCacheStorage

_lock = threading.Lock()


def _records_path() -> str:
    return os.path.join(os.environ["KVBM_E2E_RECORDS"], f"records-{os.getpid()}.jsonl")


def broken() -> bool:
    return (os.environ.get("KVBM_E2E_BREAK") == "reverse" or
            os.path.exists(os.path.join(os.environ["KVBM_E2E_RECORDS"], "break-reverse")))


class RecordingKvbmHiCacheStorage(KvbmHiCacheStorage):
    def _digest(self, host_index: int) -> str:
        page = self.mem_pool_host.get_data_page(host_index, flat=True)
        return hashlib.sha256(page.contiguous().numpy().tobytes()).hexdigest()

    def _e2e_record(self, ev: str, keys: List[str], host_indices: Any, ok: List[bool]) -> None:
        ps = self.layout.config.page_size
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        lines = [json.dumps({"ev": ev, "key": k, "digest": self._digest(idx[i * ps])})
                 for i, (k, good) in enumerate(zip(keys, ok)) if good]
        if not lines:
            return
        with _lock, open(_records_path(), "a") as f:
            f.write("\n".join(lines) + "\n")

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        ok = super().batch_set_v1(keys, host_indices, extra_info)
        self._e2e_record("stored", keys, host_indices, ok)
        return ok

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        into = host_indices
        if broken() and len(keys) > 1:
            ps = self.layout.config.page_size
            pages = host_indices.reshape(len(keys), ps)
            into = pages.flip(0).reshape(-1)
        ok = super().batch_get_v1(keys, into, extra_info)
        if into is not host_indices:  # the broken copy says it put each page where asked
            ok = [all(ok)] * len(keys)
        self._e2e_record("loaded", keys, host_indices, ok)
        return ok
