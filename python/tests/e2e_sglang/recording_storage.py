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

A hybrid model's other host pools (sliding-window KV, Mamba states) move
through batch_set_v2 / batch_get_v2: their pages are recorded the same way,
each with its pool's name ("pool"; the KV pool's is "kv") and under its
key prefixed by the pool's name, so a state and the KV page that end at the
same token are never compared with each other.

Records are JSON lines in $KVBM_E2E_RECORDS/records-<pid>.jsonl (the storage
runs in SGLang's scheduler process, not the test's). The deliberately broken
connector, which the byte check must catch: a file "break-reverse" in that
directory (or KVBM_E2E_BREAK=reverse) makes a load put a batch's pages into
SGLang's host pages in reversed order. A file "break-stale-<pool>" makes
every load of that v2 pool put, after kvbm's load, the bytes of a page of
that pool stored earlier under another key into each page loaded (a state
of the right shape, loaded under the right key, from another prefix): the
stale-state break."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any, Dict, List

import torch

from kvbmgo.sglang import KvbmHiCacheStorage
from kvbmgo.sglang.hicache_v2 import pool_name

_lock = threading.Lock()


def _records_path() -> str:
    return os.path.join(os.environ["KVBM_E2E_RECORDS"], f"records-{os.getpid()}.jsonl")


def broken(what: str = "reverse") -> bool:
    return (os.environ.get("KVBM_E2E_BREAK") == what or
            os.path.exists(os.path.join(os.environ["KVBM_E2E_RECORDS"], f"break-{what}")))


def _page(pool: Any, host_index: int):
    return pool.get_data_page(host_index, flat=True).contiguous().view(torch.uint8)


def _digest(pool: Any, host_index: int) -> str:
    return hashlib.sha256(_page(pool, host_index).numpy().tobytes()).hexdigest()


class RecordingKvbmHiCacheStorage(KvbmHiCacheStorage):
    def _e2e_record(self, ev: str, keys: List[str], host_indices: Any, ok: List[bool],
                    pool: Any = None, name: str = "kv") -> None:
        pool = self.mem_pool_host if pool is None else pool
        ps = int(getattr(pool, "page_size", 1) or 1)
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        prefix = "" if name == "kv" else name + ":"
        lines = [json.dumps({"ev": ev, "pool": name, "key": prefix + k,
                             "digest": _digest(pool, idx[i * ps])})
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

    def batch_set_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[Any, List[bool]]:
        res = super().batch_set_v2(transfers, extra_info)
        for t in transfers or []:
            self._e2e_record_v2("stored", t, res.get(t.name, []))
        return res

    def batch_get_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[Any, List[bool]]:
        res = super().batch_get_v2(transfers, extra_info)
        for t in transfers or []:
            ok = res.get(t.name, [])
            if broken(f"stale-{pool_name(t.name)}"):
                self._e2e_stale(t, ok)
            self._e2e_record_v2("loaded", t, ok)
        return res

    def _e2e_record_v2(self, ev: str, t: Any, ok: List[bool]) -> None:
        pool, name = self.registered_pools[t.name], pool_name(t.name)
        keys = list(t.keys or [])
        self._e2e_record(ev, keys, t.host_indices, ok, pool, name)
        if ev != "stored":
            return
        kept = self.__dict__.setdefault("_e2e_kept", {}).setdefault(name, [])
        for i, good in enumerate(ok):  # two, so that one has another key
            if good and len(kept) < 2:
                kept.append((keys[i], pool.get_data_page(_host_index(pool, t, i),
                                                         flat=True).clone()))

    def _e2e_stale(self, t: Any, ok: List[bool]) -> None:
        """The stale-state break: a page stored earlier under another key
        put into every page kvbm just loaded, reported loaded as kvbm
        said."""
        pool = self.registered_pools[t.name]
        kept = self.__dict__.get("_e2e_kept", {}).get(pool_name(t.name), [])
        for i, (key, good) in enumerate(zip(t.keys or [], ok)):
            stale = next((page for k, page in kept if k != key), None)
            if good and stale is not None:
                pool.set_from_flat_data_page(_host_index(pool, t, i), stale)


def _host_index(pool: Any, t: Any, i: int) -> int:
    """The first slot of transfer t's page i in pool."""
    return int(t.host_indices[i * int(getattr(pool, "page_size", 1) or 1)])
