"""RecordingKvbmConnector: KvbmConnector with a byte check, for the real
engine tests (vLLM loads it through kv_connector_module_path).

Tokens alone cannot see a block-mapping bug: a prefix's blocks swapped among
themselves give the same attention, hence the same tokens. So the worker
side keeps the digest of every G1 block's bytes it offered under each key
(at wait_for_save, after the forward wrote them and before vLLM may reuse
them) and, when a load of keys into G1 blocks ends, compares each loaded
block's bytes with the digests stored under its key. It also records the
scheduler side's external hits and the preemptions it saw, and (P/D) the
digests of the blocks a decode pulled, for the test to compare with the
prefill's.

Everything is recorded in the module-level list RECORDS of the process that
runs that side (the engine core runs in the driver's process:
VLLM_ENABLE_V1_MULTIPROCESSING=0; at TP > 1 each rank's worker side runs in
a process of its own, and engine.py reaches it through the functions at the
end, called by vLLM's collective_rpc). A worker side's records name its
rank. BREAK["reverse"]
makes the worker load a request's keys into its block ids reversed (the
deliberately broken connector the byte check must catch);
KVBM_E2E_BREAK=reverse starts with it on, which must fail every scenario
that loads (tokens may well stay equal)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from typing import Any, Dict, List, Set, Tuple

from kvbmgo.vllm import KvbmConnector
from kvbmgo.vllm.metadata import KvbmConnectorMetadata

RECORDS: List[Dict[str, Any]] = []
BREAK = {"reverse": os.environ.get("KVBM_E2E_BREAK") == "reverse"}
#: The worker-side instances (the driver scribbles over their KV caches).
WORKERS: List["RecordingKvbmConnector"] = []


class RecordingKvbmConnector(KvbmConnector):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kv: Dict[str, Any] = {}
        self._versions: Dict[bytes, Set[bytes]] = {}
        self._prepped = False
        self._sync_checks: List[Tuple[str, List[bytes], List[int]]] = []
        self._async_checks: Dict[str, Tuple[List[bytes], List[int]]] = {}
        self._pull_checks: Dict[str, List[int]] = {}
        if self._worker is not None:
            WORKERS.append(self)

    # ---- scheduler side

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            RECORDS.append({"ev": "external", "req": request.request_id,
                            "tokens": int(num_external_tokens)})
        super().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        pre = getattr(scheduler_output, "preempted_req_ids", None) or ()
        if pre:
            RECORDS.append({"ev": "preempted", "reqs": sorted(pre)})
        return super().build_connector_meta(scheduler_output)

    # ---- worker side

    def register_kv_caches(self, kv_caches: "dict[str, Any]") -> None:
        self._kv = dict(kv_caches)
        super().register_kv_caches(kv_caches)
        # A warm restart's test: the digests an earlier process stored
        # (KVBM_E2E_VERSIONS, a file of "key digest" lines it appended to).
        path = os.environ.get("KVBM_E2E_VERSIONS")
        if path and os.path.exists(path):
            with open(path) as f:
                for line in f:
                    k, _, d = line.strip().partition(" ")
                    if d:
                        self._versions.setdefault(bytes.fromhex(k), set()).add(bytes.fromhex(d))

    def _digest(self, block: int) -> bytes:
        h = hashlib.sha256()
        for v in self._kv.values():
            h.update(v[block].contiguous().cpu().numpy().tobytes())
        return h.digest()

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        super().bind_connector_metadata(connector_metadata)
        self._prepped = False

    def _prep(self) -> None:
        """Once per bound metadata, before the worker side reads it: notes
        what each load must bring (key i into block i), and breaks the
        mapping when asked to."""
        if self._prepped:
            return
        self._prepped = True
        md = self._get_connector_metadata()
        if not isinstance(md, KvbmConnectorMetadata):
            return
        for ld in md.loads:
            if ld.is_async:
                self._async_checks[ld.req_id] = (list(ld.keys), list(ld.block_ids))
            else:
                self._sync_checks.append((ld.req_id, list(ld.keys), list(ld.block_ids)))
        for p in md.pulls:
            if p.block_ids:
                self._pull_checks[p.req_id] = list(p.block_ids)
        if BREAK["reverse"] and md.loads:
            self._connector_metadata = replace(
                md, loads=[replace(ld, block_ids=list(reversed(ld.block_ids)))
                           for ld in md.loads])

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._prep()
        super().start_load_kv(forward_context, **kwargs)

    def _check(self, req_id: str, keys: List[bytes], ids: List[int], is_async: bool) -> None:
        errors = set(self._worker._load_errors)
        bad = unknown = failed = 0
        for k, b in zip(keys, ids):
            if b in errors:
                failed += 1
                continue
            seen = self._versions.get(k)
            if not seen:
                unknown += 1
            elif self._digest(b) not in seen:
                bad += 1
        RECORDS.append({"ev": "loaded", "req": req_id, "rank": self._worker.rank,
                        "blocks": len(ids), "bad": bad,
                        "unknown": unknown, "failed": failed, "async": is_async})

    def wait_for_save(self) -> None:
        self._prep()
        super().wait_for_save()
        checks, self._sync_checks = self._sync_checks, []
        for req_id, keys, ids in checks:
            self._check(req_id, keys, ids, False)
        md = self._get_connector_metadata()
        path = os.environ.get("KVBM_E2E_VERSIONS")
        lines = []
        for st in md.stores:
            for k, b in zip(st.keys, st.block_ids):
                d = self._digest(b)
                self._versions.setdefault(k, set()).add(d)
                lines.append(f"{k.hex()} {d.hex()}\n")
        if path and lines:  # kept for the process after this one (a SIGKILL included)
            with open(path, "a") as f:
                f.write("".join(lines))

    def get_finished(self, finished_req_ids: "set[str]") -> Any:
        sending, recving = super().get_finished(finished_req_ids)
        for r in recving or ():
            if r in self._async_checks:
                keys, ids = self._async_checks.pop(r)
                self._check(r, keys, ids, True)
            if r in self._pull_checks:
                # P/D: the test compares these with the prefill's blocks.
                ids = self._pull_checks.pop(r)
                errors = set(self._worker._load_errors)
                RECORDS.append({"ev": "pulled", "req": r, "rank": self._worker.rank,
                                "block_ids": ids,
                                "failed": len(errors.intersection(ids)),
                                "digests": [self._digest(b).hex() for b in ids]})
        return sending, recving

    def cache_stats(self) -> Any:
        return self._worker.worker.cache.stats()


# ---- the worker ops of engine.py: run in each rank's process (collective_rpc
# passes vLLM's worker first; engine.py passes None at TP 1)

def take_records(_worker: Any) -> List[Dict[str, Any]]:
    out = list(RECORDS)
    del RECORDS[:]
    return out


def scribble(_worker: Any) -> None:
    """Overwrites every KV cache tensor of this process with noise."""
    import torch
    g = torch.Generator().manual_seed(1234)
    for w in WORKERS:
        for t in w._kv.values():
            t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))


def set_break(_worker: Any, reverse: bool) -> bool:
    was = BREAK["reverse"]
    BREAK["reverse"] = reverse
    return was


def digests(_worker: Any, block_ids: List[List[int]]) -> List[List[str]]:
    w = WORKERS[0]
    return [[w._digest(b).hex() for b in ids] for ids in block_ids]


def stats(_worker: Any) -> List[Dict[str, Any]]:
    from dataclasses import asdict
    return [dict(asdict(w.cache_stats()), rank=w._worker.rank,
                 worker_id=w._worker.worker.worker_id) for w in WORKERS]
