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
rank.

With several KV cache groups (vLLM's hybrid KV cache manager) a key names
its group (groups.py) and a block's bytes are its group's layers' pages
only, so the digests are per group, and the scheduler side also checks each
load against vLLM's own block table ("load_map": every id the one vLLM
allocated for that group and block, never the null block, a
sliding-window group's blocks exactly those in the window of the hit's end,
and a Mamba group's one state, the hit's end's, in its table entry for the
hit's last block). A Mamba layer's view is its state page as int8 (vLLM's
[blocks, 1, 1, state bytes]): its digest is the state's bytes.

The deliberately broken connectors the byte check must catch (tokens may
well stay equal): BREAK["reverse"] makes the worker load a request's keys
into its block ids reversed; BREAK["stale_window"] makes it store each
sliding-window block from a stale id, the one of its request's block before
it in that group (an id vLLM frees as the window moves on and hands to
another request), while the reference digests stay those of the right ids;
BREAK["stale_mamba"] makes the worker load, into a Mamba group's state
block, the state stored under another key of that group: the state at the
boundary a block before the hit's end when this process stored it, else
the last other state it stored (another prompt's), else the page of the
hit's last attention block, while the check's
reference stays the right key's digests.
KVBM_E2E_BREAK=reverse (or stale_window, stale_mamba) starts with it on,
which must fail every scenario that loads."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from typing import Any, Dict, List, Set, Tuple

from kvbmgo.vllm import KvbmConnector
from kvbmgo.vllm.metadata import KvbmConnectorMetadata

RECORDS: List[Dict[str, Any]] = []
BREAK = {k: os.environ.get("KVBM_E2E_BREAK") == k
         for k in ("reverse", "stale_window", "stale_mamba")}
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
        self._pull_remote: Dict[str, List[int]] = {}
        self._stores: List[Any] = []
        self._last_window: Dict[Tuple[str, int], int] = {}   # stale_window's ids
        #: stale_mamba's: group -> the last two state keys stored (newest last).
        self._last_states: Dict[int, List[bytes]] = {}
        groups = list(getattr(kv_cache_config_of(self), "kv_cache_groups", None) or ())
        #: Each group's layers (a hybrid key's bytes are these layers' pages),
        #: and the sliding windows (tokens) of the sliding-window groups.
        self._layers = [list(g.layer_names) for g in groups]
        self._windows = {i: int(g.kv_cache_spec.sliding_window) for i, g in enumerate(groups)
                         if "SlidingWindow" in type(g.kv_cache_spec).__name__}
        #: The Mamba (linear-attention) groups: a state per block boundary.
        self._mamba = {i for i, g in enumerate(groups)
                       if type(g.kv_cache_spec).__name__ == "MambaSpec"}
        if self._worker is not None:
            WORKERS.append(self)

    # ---- scheduler side

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            RECORDS.append({"ev": "external", "req": request.request_id,
                            "tokens": int(num_external_tokens)})
        loads = self._scheduler._loads
        n = len(loads)
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        if self.groups.hybrid:
            for ld in loads[n:]:
                RECORDS.append(load_map(self.groups, self._windows, request, blocks, ld,
                                        self._mamba))

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

    def _digest(self, block: int, group: "int | None" = None, head: "int | None" = None
                ) -> bytes:
        """The bytes of block: of group's layers (None: every layer); of
        one of its KV heads (a view's dim 1) or all."""
        h = hashlib.sha256()
        names = self._kv if group is None else self._layers[group]
        for name in names:
            v = self._kv[name][block]
            h.update((v if head is None else v[head]).contiguous().cpu().numpy().tobytes())
        return h.digest()

    def _head_digests(self, block: int, group: int) -> List[str]:
        """Per KV head of this rank, the digest of block over group's layers."""
        heads = int(self._kv[self._layers[group][0]].shape[1])
        return [self._digest(block, group, i).hex() for i in range(heads)]

    def _key_digest(self, key: bytes, block: int) -> bytes:
        return self._digest(block, self.groups.split(key)[1])

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
                self._pull_remote[p.req_id] = list(p.remote_block_ids)
        self._stores = list(md.stores)  # the right ids, whatever is broken
        if BREAK["reverse"] and md.loads:
            md = replace(md, loads=[replace(ld, block_ids=list(reversed(ld.block_ids)))
                                    for ld in md.loads])
        if BREAK["stale_window"] and md.stores and self._windows:
            md = replace(md, stores=[replace(st, block_ids=self._stale(st))
                                     for st in md.stores])
        if BREAK["stale_mamba"] and md.loads and self._mamba:
            md = replace(md, loads=[replace(ld, keys=self._stale_states(ld))
                                    for ld in md.loads])
        self._connector_metadata = md

    def _stale_states(self, ld: Any) -> List[bytes]:
        """ld's keys with each Mamba state's that of another key this
        process stored: its group's at the boundary a block before (the
        hash of the load's block before the last), else its group's last
        other state, else (none yet) the page of the attention block of its
        hash."""
        keys = list(ld.keys)
        hashes: List[bytes] = []
        for k in keys:
            h = self.groups.split(k)[0]
            if not hashes or hashes[-1] != h:
                hashes.append(h)
        for i, k in enumerate(keys):
            h, g = self.groups.split(k)
            if g not in self._mamba:
                continue
            earlier = hashes[-2] + k[len(h):] if len(hashes) > 1 else None
            others = [s for s in self._last_states.get(g, ()) if s != k]
            attention = [o for o in ld.keys if o[:len(h)] == h and len(o) == len(k)
                         and self.groups.split(o)[1] not in self._mamba]
            if earlier is not None and earlier in self._versions:
                keys[i], how = earlier, "earlier boundary"
            elif others:
                keys[i], how = others[-1], "another prompt's"
            elif attention:
                keys[i], how = attention[0], "an attention block's"
            else:
                how = "none"
            RECORDS.append({"ev": "stale_mamba", "req": ld.req_id, "group": g, "from": how})
        return keys

    def _stale(self, st: Any) -> List[int]:
        """st's ids with each sliding-window block's the id of the block its
        request stored in that group before it, in this step or an earlier
        one (its first block's: its own)."""
        ids = list(st.block_ids)
        for i, k in enumerate(st.keys):
            g = self.groups.split(k)[1]
            if g in self._windows:
                ids[i] = self._last_window.get((st.req_id, g), ids[i])
                self._last_window[(st.req_id, g)] = st.block_ids[i]
        return ids

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._prep()
        super().start_load_kv(forward_context, **kwargs)

    def _check(self, req_id: str, keys: List[bytes], ids: List[int], is_async: bool) -> None:
        errors = set(self._worker._load_errors)
        bad = unknown = failed = 0
        per_group: Dict[str, List[int]] = {}   # group: [blocks, bad]
        for k, b in zip(keys, ids):
            g = per_group.setdefault(str(self.groups.split(k)[1]), [0, 0])
            g[0] += 1
            if b in errors:
                failed += 1
                continue
            seen = self._versions.get(k)
            if not seen:
                unknown += 1
            elif self._key_digest(k, b) not in seen:
                bad += 1
                g[1] += 1
        RECORDS.append({"ev": "loaded", "req": req_id, "rank": self._worker.rank,
                        "blocks": len(ids), "bad": bad, "groups": per_group,
                        "unknown": unknown, "failed": failed, "async": is_async})

    def wait_for_save(self) -> None:
        self._prep()
        super().wait_for_save()
        checks, self._sync_checks = self._sync_checks, []
        for req_id, keys, ids in checks:
            self._check(req_id, keys, ids, False)
        path = os.environ.get("KVBM_E2E_VERSIONS")
        lines = []
        for st in self._stores:
            for k, b in zip(st.keys, st.block_ids):
                d = self._key_digest(k, b)
                g = self.groups.split(k)[1]
                if g in self._mamba and k not in self._last_states.get(g, ()):
                    self._last_states[g] = (self._last_states.get(g, []) + [k])[-2:]
                self._versions.setdefault(k, set()).add(d)
                lines.append(f"{k.hex()} {d.hex()}\n")
        self._stores = []
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
                rec = {"ev": "pulled", "req": r, "rank": self._worker.rank,
                       "block_ids": ids, "remote_block_ids": self._pull_remote.pop(r, []),
                       "failed": len(errors.intersection(ids)),
                       "digests": [self._digest(b).hex() for b in ids]}
                if self.groups.hybrid:  # each block over each group's layers
                    rec["group_digests"] = {g.index: [self._digest(b, g.index).hex()
                                                      for b in ids]
                                            for g in self.groups.kept}
                    # Between TP sizes: per head (the test maps them to ranks).
                    rec["head_digests"] = {g.index: [self._head_digests(b, g.index)
                                                     for b in ids]
                                           for g in self.groups.kept}
                RECORDS.append(rec)
        return sending, recving

    def cache_stats(self) -> Any:
        return self._worker.worker.cache.stats()


def kv_cache_config_of(connector: Any) -> Any:
    """The KVCacheConfig vLLM built the connector with (None: not given)."""
    return getattr(connector, "_kv_cache_config", None)


def load_map(groups: Any, windows: Dict[int, int], request: Any, blocks: Any,
             ld: Any, mamba: Set[int] = frozenset()) -> Dict[str, Any]:
    """Checks a hybrid load against vLLM's block table (blocks: what it
    allocated the request, one table per group): each key of group g and
    block j goes into vLLM's id of (g, j), which is never the null block
    (0); a sliding-window group loads exactly its blocks after the load's
    first that reach into the window of the token after the hit; a Mamba
    group (mamba) exactly one state, the hit's end's, into its entry for the
    hit's last block (state_wrong counts what is not so)."""
    tables = blocks.get_block_ids()
    bs = groups.block_size
    at = {groups.block_hash(request.block_hashes, j): j
          for j in range(groups.num_blocks(request.block_hashes))}
    placed = [(g, at.get(h, -1), b) for h, g, b in
              ((*groups.split(k), b) for k, b in zip(ld.keys, ld.block_ids))]
    js = [j for _, j, _ in placed]
    start, end = min(js), max(js) + 1   # the hit: blocks start..end-1
    first_in = {g: max(start, (end * bs - w + 1) // bs) for g, w in windows.items()}
    per_group: Dict[str, int] = {}
    null = wrong = out = 0
    for g, j, b in placed:
        per_group[str(g)] = per_group.get(str(g), 0) + 1
        null += b == 0
        wrong += j < 0 or j >= len(tables[g]) or tables[g][j] != b
        out += g in first_in and j < first_in[g]
    loaded = {(g, j) for g, j, _ in placed}
    missing = sum(1 for g, f in first_in.items() for j in range(f, end) if (g, j) not in loaded)
    states = {g: [j for gg, j, _ in placed if gg == g] for g in mamba}
    state_wrong = sum(js != [end - 1] for js in states.values())
    return {"ev": "load_map", "req": ld.req_id, "groups": per_group, "null": null,
            "wrong": wrong, "out_of_window": out, "window_missing": missing,
            "state_wrong": state_wrong, "hit_blocks": [start, end]}


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
            if t.dtype.is_floating_point:
                t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))
            else:  # a Mamba layer's state pages (int8 views)
                t.copy_(torch.randint(-128, 128, t.shape, generator=g, dtype=t.dtype))


def set_break(_worker: Any, reverse: bool, stale_window: "bool | None" = None,
              stale_mamba: "bool | None" = None) -> List[bool]:
    """Sets the breaks (stale_window, stale_mamba None: left as they are);
    the old values."""
    was = [BREAK["reverse"], BREAK["stale_window"], BREAK["stale_mamba"]]
    BREAK["reverse"] = reverse
    for k, v in (("stale_window", stale_window), ("stale_mamba", stale_mamba)):
        if v is not None:
            BREAK[k] = v
    return was


def digests(_worker: Any, block_ids: List[List[int]], group: "int | None" = None,
            heads: bool = False) -> List[List[Any]]:
    """The digests of blocks: of group's layers (None: every layer); with
    heads, a list per block, one per KV head of this rank (group needed)."""
    w = WORKERS[0]
    if heads:
        return [[w._head_digests(b, group) for b in ids] for ids in block_ids]
    return [[w._digest(b, group).hex() for b in ids] for ids in block_ids]


def stats(_worker: Any) -> List[Dict[str, Any]]:
    from dataclasses import asdict
    return [dict(asdict(w.cache_stats()), rank=w._worker.rank,
                 worker_id=w._worker.worker.worker_id) for w in WORKERS]
