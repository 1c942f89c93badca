"""The scheduler side of KvbmConnector: which of a request's blocks the
cache holds, which to load and which to offer for storing, per step.

It touches no tensor and no libkvbm.so. The cache lives in the worker
processes (it reads and writes their G1 memory); the scheduler learns what
it holds from the cache's own events (a key entered or left G2, G3 or G4),
which each worker drains every step and sends back with its step output.
The scheduler keeps them as an index: key -> tiers holding it. That index is
a mirror, not a policy: what is stored, evicted, deduplicated or admitted is
decided by the library; a block the index still names but the cache dropped
meanwhile fails its load and is reported (and recomputed or failed, by
``kv_load_failure_policy``), never loaded wrong.
"""

from __future__ import annotations

import logging
from itertools import islice
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Container, Deque, Dict, Iterable, List, Optional, Set, Tuple

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.v1.request import RequestStatus

from .._control import new_token
from .config import KvbmConfig
from . import hybrid_blocks, pd_groups
from .groups import NULL_BLOCK, KvGroups
from .load_policy import LoadPolicy
from .stats import KvbmConnectorStats
from .stores_in_flight import StoresInFlight
from .metadata import (LOST, SYNC_FAILURE_STEPS, BlockLoad, BlockStore, KvbmConnectorMetadata,
                       KvbmWorkerMetadata, RemotePull, RemoteSend)

__all__ = ["KvbmScheduler"]

log = logging.getLogger(__name__)

STORED, REMOVED = 1, 2
#: vLLM's media names (vllm.distributed.kv_events.MEDIUM_*) per kvbm tier.
_MEDIUM = {2: "CPU", 3: "STORAGE", 4: "STORAGE"}
_MAX_TOKENS = 1 << 17


@dataclass
class _Request:
    request: Any                      # vllm.v1.request.Request (its block_hashes grow)
    # Its block table, one list per kept KV cache group (KvGroups.kept).
    block_ids: List[List[int]] = field(default_factory=list)
    next_store: int = 0               # blocks before it were offered or hit already
    match: Tuple[int, int] = (0, 0)   # (first block, blocks) of the last match
    remote: bool = False              # the last match was a remote prefill's
    looked: int = 0                   # tokens the last match could have served


#: The kv_transfer_params keys a decode request needs (NixlConnector's).
_REMOTE_KEYS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port",
                "remote_block_ids")


def _remote_prefill(request: Any) -> Optional[dict]:
    """request's kv_transfer_params when it asks for a remote prefill's KV
    and names where it is; None otherwise (a malformed one is logged once
    and the request is computed here)."""
    params = getattr(request, "kv_transfer_params", None)
    if not params or not params.get("do_remote_prefill"):
        return None
    missing = [k for k in _REMOTE_KEYS if params.get(k) is None]
    if missing:
        log.warning("kvbm: request %s asks for a remote prefill without %s; computing it "
                    "here", request.request_id, ", ".join(missing))
        params["do_remote_prefill"] = False
        return None
    return params


def _known(event: type, fields: dict) -> dict:
    """fields that vLLM's event class has (older ones lack the group's)."""
    have = getattr(event, "__struct_fields__", ())
    return {k: v for k, v in fields.items() if k in have}


class KvbmScheduler:
    def __init__(self, config: KvbmConfig, block_size: int, *, role: str = "kv_both",
                 engine_id: str = "", tp_size: int = 1, dp_index: int = 0,
                 groups: Optional[KvGroups] = None) -> None:
        self.config = config
        self.groups = groups if groups is not None else KvGroups.single(block_size)
        self.block_size = self.groups.block_size
        # Several KV cache groups: vLLM accepts no per-block load failure
        # (invalid_block_ids), only a failed request (failed_recving), which
        # it acts on for an async load alone: every load is async.
        if self.groups.hybrid:
            self.groups.warn_inert()
            if not config.async_load and self.groups.inert is None:
                log.info("kvbm: %d KV cache groups: loads are async (load_mode 'sync' is for "
                         "models with one group)", self.groups.num_groups)
        self._warned_pd = False
        self._kept_ids = frozenset(g.index for g in self.groups.kept)
        # P/D: which kv_transfer_params this instance acts on.
        self.producer = role in ("kv_producer", "kv_both")
        self.consumer = role in ("kv_consumer", "kv_both")
        self.engine_id = engine_id
        self.tp_size = tp_size
        self.port = config.pd_port + dp_index * tp_size  # rank 0's side channel
        self._sends: List[RemoteSend] = []
        self._pulls: List[RemotePull] = []
        self._tiers: Dict[bytes, Set[int]] = {}       # key -> tiers holding it
        self._in_flight = StoresInFlight(tp_size)     # stores not heard the end of
        # For BlockStored: (parent hash, tokens) of keys offered or cached,
        # at most _MAX_TOKENS (oldest dropped first: their events then carry
        # no tokens; offers the cache declined would otherwise stay forever).
        self._tokens: "OrderedDict[bytes, Tuple[Optional[bytes], List[int]]]" = OrderedDict()
        self._requests: Dict[str, _Request] = {}
        self._loads: List[BlockLoad] = []
        self._events: List[KVCacheEvent] = []
        self._stats = KvbmConnectorStats()
        self._reset = False  # reset_cache was called: tell the workers
        self._recent_sync: Deque[Set[int]] = deque(maxlen=SYNC_FAILURE_STEPS)
        self._policy = LoadPolicy(config.load_policy == "auto", self.block_size)

    # ---- vLLM's scheduler calls, in its order

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> Tuple[Optional[int], bool]:
        """Tokens beyond num_computed_tokens the cache can load: whole
        blocks that follow the GPU's hit, leaving at least one prompt token
        to compute; None while the hit would grow with stores in flight.
        Side-effect free but for remembering the answer.

        A decode request of a remote prefill (kv_transfer_params
        do_remote_prefill) loads, asynchronously, every prompt token not
        computed here, the partial last block's too, as NixlConnector
        does; vLLM then recomputes only the last prompt token. With a
        Mamba group all but the last (pd_groups.remote_tokens): the
        prefill computed no more."""
        bs = self.block_size
        start = num_computed_tokens // bs
        if self.consumer and self._remote_prefill(request) is not None:
            count = pd_groups.remote_tokens(self.groups, len(request.prompt_token_ids or ())) \
                - num_computed_tokens
            if count > 0:
                self._remember(request, (start, -(-count // bs)), True)
                return count, True
        hashes = request.block_hashes
        # vLLM computes at least one token: never claim the last prompt token.
        limit = (request.num_tokens - 1) // bs
        match = self._hybrid_match if self.groups.hybrid else self._match
        n = match(hashes, start, limit, self._tiers)
        # A prefix that runs on into blocks being stored: asked again next
        # step, when the index may have them (stores_in_flight.py).
        if self._in_flight and match(hashes, start, limit,
                                     self._in_flight.with_index(self._tiers)) > n \
                and self._in_flight.may_wait(request.request_id):
            return None, False
        self._in_flight.done_waiting(request.request_id)
        if n and self._policy.enabled:  # load or recompute (load_policy.py)
            m = self._policy.blocks_to_load(self._block_tiers(hashes, start, n))
            if m < n:
                # A hybrid hit still ends where every kept group restores.
                m = match(hashes, start, start + m, self._tiers) if self.groups.hybrid else m
                self._stats.add("declined_tokens", (n - m) * bs)
                n = m
        self._remember(request, (start, n), False, max(0, limit - start) * bs)
        if self.groups.hybrid:
            return (n * bs, True) if n else (0, False)
        if n == 0:
            return 0, False
        return n * bs, self.config.async_load

    @staticmethod
    def _match(hashes: Any, start: int, limit: int, keys: Container[bytes]) -> int:
        """How many blocks after start keys holds, in a row."""
        n = 0
        # vLLM's BlockHash is bytes at run time: looked up as it is.
        for h in islice(hashes, start, limit):
            if h not in keys:
                break
            n += 1
        return n

    def _block_tiers(self, hashes: Any, start: int, n: int) -> List[int]:
        """The fastest tier holding each of blocks start..start+n (a hybrid
        block: its first kept group's key)."""
        groups = self.groups
        out = []
        for j in range(start, start + n):
            key = groups.key(groups.block_hash(hashes, j), groups.kept[0]) \
                if groups.hybrid else bytes(hashes[j])
            out.append(min(self._tiers.get(key) or (2,)))
        return out

    def on_new_request(self, request: Any) -> None:
        """A prefill request of a model with a Mamba group stops one prompt
        token short, as NixlConnector's (pd_groups.truncate_for_prefill)."""
        if self.producer and self.groups.mamba and self._pd_off() is None:
            pd_groups.truncate_for_prefill(self.groups, request)

    def _remote_prefill(self, request: Any) -> Optional[dict]:
        """_remote_prefill, but a hybrid model whose groups kvbm cannot keep
        (groups.inert) computes the request here (said once)."""
        if self._pd_off() is not None:
            params = getattr(request, "kv_transfer_params", None)
            if params and params.get("do_remote_prefill"):
                self._warn_pd()
                params["do_remote_prefill"] = False
            return None
        return _remote_prefill(request)

    def _pd_off(self) -> Optional[str]:
        """Why P/D is off for this model (None: on). With a Mamba group it
        is on unless "pd_mamba" is false (config.py)."""
        if self.groups.inert is None and self.groups.mamba and not self.config.pd_mamba:
            return (f"Mamba group {self.groups.mamba[0].index}: P/D of Mamba states is "
                    f"off (\"pd_mamba\": false)")
        return self.groups.inert

    def _warn_pd(self) -> None:
        if not self._warned_pd:
            self._warned_pd = True
            log.warning("kvbm: disaggregated prefill->decode is off for this model (%s): "
                        "requests that ask for it are computed here and prefills hold "
                        "nothing for a decode", self._pd_off())

    # ---- several KV cache groups (groups.py, hybrid_blocks.py)

    def _hybrid_match(self, hashes: Any, start: int, limit: int, tiers: Container[bytes]
                      ) -> int:
        return hybrid_blocks.match(self.groups, hashes, start, limit, tiers, self.block_size)

    def _remembers(self, request: Any) -> hybrid_blocks.Remember:
        """What a hybrid key's BlockStored will say (parent, request's tokens)."""
        def remember(key: bytes, parent: Optional[bytes], i: int) -> None:
            if key not in self._tokens:
                self._remember_tokens(key, parent, request, i)
        return remember

    def _hybrid_store(self, st: _Request, full: int) -> Tuple[List[bytes], List[int]]:
        return hybrid_blocks.store(self.groups, st.request.block_hashes, st.block_ids,
                                   st.next_store, full, self._remembers(st.request))

    def _boundary_states(self, scheduler_output: Any, stores: List[BlockStore]) -> None:
        """Adds the stores of the Mamba states vLLM offers this step (its
        align mode's boundary_state_offloads, for vLLM >= 0.33)."""
        state = getattr(scheduler_output, "kv_connector_block_state", None)
        offers = getattr(state, "boundary_state_offloads", None)
        if not offers or not self.groups.mamba:
            return
        for req_id, entries in offers.items():
            st = self._requests.get(req_id)
            if st is None:
                continue
            keys, ids = hybrid_blocks.boundary_states(
                self.groups, st.request.block_hashes, entries, self.block_size,
                self._remembers(st.request))
            if keys:
                stores.append(BlockStore(req_id, keys, ids, []))

    def _allocated(self, out: List[int], tables: Any, hit: int) -> None:
        """Adds the G1 blocks of tables (one per KV cache group) a step may
        write: a kept group's after hit (hit blocks are read), another
        group's all of them; never the null block."""
        kept = self._kept_ids
        for i, table in enumerate(tables):
            out.extend(b for b in (table[hit:] if i in kept else table) if b != NULL_BLOCK)

    def _remember_tokens(self, key: bytes, parent: Optional[bytes], request: Any,
                         i: int) -> None:
        bs = self.block_size
        self._tokens[key] = (parent, list(request.all_token_ids[i * bs:(i + 1) * bs]))
        if len(self._tokens) > _MAX_TOKENS:
            self._tokens.popitem(last=False)

    def _remember(self, request: Any, match: Tuple[int, int], remote: bool,
                  looked: int = 0) -> None:
        st = self._requests.get(request.request_id)
        if st is None:
            st = self._requests[request.request_id] = _Request(request)
        st.looked = looked
        st.match, st.remote = match, remote

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        st = self._requests.get(request.request_id)
        if st is None:
            st = self._requests[request.request_id] = _Request(request)
        st.request = request
        start, n = st.match
        params = self._remote_prefill(request) if self.consumer else None
        if params is not None:
            self._pull(request, params, blocks, start, num_external_tokens)
            st.next_store = max(st.next_store, start + num_external_tokens // self.block_size)
            return
        if st.looked:  # counted once per match (async: alloc is called twice)
            self._stats.add("lookup_tokens", st.looked)
            self._stats.add("hit_tokens", num_external_tokens)
            st.looked = 0
        # Blocks the GPU or the cache hit are not offered again.
        nb = num_external_tokens // self.block_size
        st.next_store = max(st.next_store, start + nb)
        if nb == 0:
            return
        if nb > n:
            raise RuntimeError(f"request {request.request_id}: vLLM asks for {nb} external "
                               f"blocks, the cache matched {n}")
        if self.groups.hybrid:
            keys, load_ids, why = hybrid_blocks.load(self.groups, request.block_hashes,
                                                     blocks.get_block_ids(), start, nb)
            if why:
                log.warning("kvbm: request %s: %s; its load of %d blocks fails "
                            "(failed_recving)", request.request_id, why, nb)
            self._loads.append(BlockLoad(request.request_id, keys, load_ids, True, why))
            return
        ids = blocks.get_block_ids()[0]
        # blocks: the request's blocks from its first; the load fills those
        # after the GPU's hit.
        load_ids = list(ids[start:start + nb])
        keys = [bytes(h) for h in request.block_hashes[start:start + nb]]
        self._loads.append(BlockLoad(request.request_id, keys, load_ids, self.config.async_load))

    def _pull(self, request: Any, params: dict, blocks: Any, start: int,
              num_external_tokens: int) -> None:
        """Records the pull of a remote prefill's blocks into the request's
        blocks from the first not computed here (none: only tell the prefill
        to let go). One pull per request, as NixlConnector."""
        params["do_remote_prefill"] = False
        local: List[int] = []
        remote: List[int] = []
        refused = ""
        if num_external_tokens > 0:
            # Per KV cache group, or refused (pd_groups.py). Lengths that
            # differ (another block size, a shorter list) fail the pull.
            remote, local, refused = pd_groups.pairs(self.groups, params,
                                                     blocks.get_block_ids(), start,
                                                     num_external_tokens, self.tp_size)
        self._pulls.append(RemotePull(
            request.request_id, str(params["remote_engine_id"]),
            str(params["remote_request_id"]), str(params["remote_host"]),
            int(params["remote_port"]), int(params.get("tp_size") or 1), remote, local,
            str(params.get("kvbm_token") or ""), params.get("kvbm_worker_id"), refused))

    def build_connector_meta(self, scheduler_output: Any) -> KvbmConnectorMetadata:
        """This step's loads, the stores of every block this step completes,
        the blocks handed to requests this step and the preempted requests
        (stores still reading their blocks are waited for before the
        forward writes them). Resets the step's state."""
        bs = self.block_size
        stores: List[BlockStore] = []
        scheduled = scheduler_output.num_scheduled_tokens
        # The G1 blocks sync loads filled this step and the few before (with
        # async scheduling or pipeline stages vLLM runs a step before it
        # hears of the last one's failed loads): a store computed over one
        # that failed is dropped by the worker side.
        self._recent_sync.append({b for ld in self._loads if not ld.is_async
                                  for b in ld.block_ids})
        sync_ids = set().union(*self._recent_sync)

        def offer(req_id: str, computed: int, computed_after: int) -> None:
            st = self._requests.get(req_id)
            if st is None:
                return
            # Fewer tokens computed than blocks offered: vLLM rewound the
            # request (a failed load, a preemption); its blocks are computed
            # again and offered again. vLLM rewinds to a block's start; a
            # count inside a block is the last prompt token recomputed after
            # a load of the whole prompt (that block's KV is the load's, not
            # computed again, and is not offered again).
            if computed % bs == 0:
                st.next_store = min(st.next_store, computed // bs)
            hashes = st.request.block_hashes
            table = st.block_ids[0] if st.block_ids else []
            full = min(self.groups.num_blocks(hashes), computed_after // bs, len(table))
            if full <= st.next_store:
                return
            if self.groups.hybrid:
                keys, ids = self._hybrid_store(st, full)
            else:
                keys = [bytes(h) for h in hashes[st.next_store:full]]
                ids = table[st.next_store:full]
                for i in range(st.next_store, full):
                    k = keys[i - st.next_store]
                    if k not in self._tokens:
                        parent = bytes(hashes[i - 1]) if i > 0 else None
                        self._remember_tokens(k, parent, st.request, i)
            depends = [b for b in table[:st.next_store] if b in sync_ids] \
                if sync_ids else []
            if keys:
                stores.append(BlockStore(req_id, keys, ids, depends))
            st.next_store = full

        # Blocks written this step: loads' and pulls' (their requests may
        # not be scheduled: they wait for the KV), and what scheduled
        # requests compute, from after their GPU prefix hit (a hit block is
        # read, not written).
        allocated: List[int] = [b for ld in self._loads for b in ld.block_ids]
        allocated += [b for p in self._pulls for b in p.block_ids]
        kept = self.groups.kept
        for new in scheduler_output.scheduled_new_reqs:
            st = self._requests.get(new.req_id)
            hit = st.match[0] if st is not None else new.num_computed_tokens // bs
            self._allocated(allocated, new.block_ids, hit)
            if st is None:
                continue
            st.block_ids = [list(new.block_ids[g.index]) for g in kept]
            offer(new.req_id, new.num_computed_tokens,
                  new.num_computed_tokens + scheduled.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        # vLLM <= 0.33 sends a resumed (preempted) request among the cached
        # ones with its whole block table (resumed_req_ids); 0.34 dropped
        # that field and re-sends it whole in scheduled_new_reqs (above), so
        # every cached request's new_block_ids are appends.
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
        for i, req_id in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                self._allocated(allocated, new_ids, 0)
            st = self._requests.get(req_id)
            if st is None:
                continue
            if req_id in resumed:
                st.block_ids = [list(new_ids[g.index]) for g in kept] \
                    if new_ids is not None else []
            elif new_ids is not None:
                if not st.block_ids:
                    st.block_ids = [[] for _ in kept]
                for table, g in zip(st.block_ids, kept):
                    table.extend(new_ids[g.index])
            offer(req_id, cached.num_computed_tokens[i],
                  cached.num_computed_tokens[i] + scheduled.get(req_id, 0))
        self._boundary_states(scheduler_output, stores)
        preempted = list(getattr(scheduler_output, "preempted_req_ids", None) or ())
        for req_id in preempted:
            st = self._requests.get(req_id)
            if st is not None:
                st.block_ids = []
        self._in_flight.expire()
        timed = self._policy.step_started(scheduler_output.total_num_scheduled_tokens)
        md = KvbmConnectorMetadata(loads=self._loads, stores=stores, allocated=allocated,
                                   preempted=preempted, sends=self._sends, pulls=self._pulls,
                                   reset_cache=self._reset, timed_step=timed,
                                   store_batch=self._in_flight.offer(
                                       k for st in stores for k in st.keys))
        self._loads, self._sends, self._pulls = [], [], []
        self._reset = False
        return md

    def request_finished(self, request: Any, block_ids: List[int]
                         ) -> Tuple[bool, Optional[dict]]:
        """A finished request's blocks go back to vLLM at once, stores in
        flight or not (as OffloadingConnector's): a block vLLM hands to
        another request is named in a later step's metadata (allocated), and
        the worker side waits for the stores reading it before that step
        writes it.

        P/D: a prefill request (kv_transfer_params do_remote_decode) that
        ended normally holds its blocks until the decode instance is done
        with them, and returns the kv_transfer_params that NixlConnector
        returns, naming them. A decode request that ends before its pull was
        recorded (aborted) tells the prefill to let go."""
        req_id = request.request_id
        self._requests.pop(req_id, None)
        self._in_flight.done_waiting(req_id)
        params = getattr(request, "kv_transfer_params", None) or {}
        if self.consumer and params.get("do_remote_prefill") \
                and self._remote_prefill(request) is not None:
            self._pull(request, params, None, 0, 0)
        out: Optional[dict] = None
        if self.producer and params.get("do_remote_decode") and block_ids \
                and request.status in (RequestStatus.FINISHED_LENGTH_CAPPED,
                                       RequestStatus.FINISHED_STOPPED):
            token = new_token()  # the decode's proof (pd_prefill.py)
            self._sends.append(RemoteSend(req_id, list(block_ids), token))
            out = dict(do_remote_prefill=True, do_remote_decode=False,
                       remote_block_ids=list(block_ids), remote_engine_id=self.engine_id,
                       remote_request_id=req_id, remote_host=self.config.pd_host,
                       remote_port=self.port, tp_size=self.tp_size,
                       remote_num_tokens=request.num_computed_tokens, kvbm_token=token)
            if self.config.worker_id is not None:
                out["kvbm_worker_id"] = self.config.worker_id
        return out is not None, out

    def request_finished_all_groups(self, request: Any, block_ids: Tuple[List[int], ...]
                                    ) -> Tuple[bool, Optional[dict]]:
        """vLLM's call with its hybrid KV cache manager on: one list of
        blocks per KV cache group. One group: request_finished. Several: a
        prefill request holds each kept group's blocks a decode pulls
        (pd_groups.sent) and names them per group."""
        if not self.groups.hybrid:
            return self.request_finished(request, list(block_ids[0]) if block_ids else [])
        params = getattr(request, "kv_transfer_params", None) or {}
        if not (self.producer and params.get("do_remote_decode")):
            return self.request_finished(request, [])
        if self._pd_off() is not None:
            self._warn_pd()
            return self.request_finished(request, [])
        lists, held = pd_groups.sent(self.groups, block_ids)
        hold, out = self.request_finished(request, held)
        if out is not None:
            out.update(remote_block_ids=lists, kvbm_groups=pd_groups.layout(self.groups))
        return hold, out

    def update_connector_output(self, connector_output: Any) -> None:
        """Feeds the workers' cache events into the index and into
        take_events, then ends the store batches they said are over."""
        md = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(md, KvbmWorkerMetadata):
            self.apply_events(md.events)
            self._in_flight.settled(md.settled)
            self._policy.step_ended(md.load, md.step)

    def apply_events(self, events: Iterable[Tuple[int, int, bytes]]) -> None:
        bs = self.block_size
        hybrid = self.groups.hybrid
        for kind, tier, key in events:
            medium = _MEDIUM.get(tier, "STORAGE")
            if kind == STORED:
                self._tiers.setdefault(key, set()).add(tier)
                parent, tokens = self._tokens.get(key, (None, []))
                if hybrid:
                    self._events.append(self._group_stored(key, parent, tokens, medium))
                    continue
                self._events.append(BlockStored(block_hashes=[key], parent_block_hash=parent,
                                                token_ids=tokens, block_size=bs, lora_id=None,
                                                medium=medium, lora_name=None))
            elif kind == LOST:
                # Not a change of the cache, a correction of the index.
                self._tiers.pop(key, None)
                self._tokens.pop(key, None)
            elif kind == REMOVED:
                tiers = self._tiers.get(key)
                if tiers is not None:
                    tiers.discard(tier)
                    if not tiers:
                        del self._tiers[key]
                        self._tokens.pop(key, None)
                if hybrid:
                    raw, group = self.groups.split(key)
                    self._events.append(BlockRemoved(block_hashes=[raw], medium=medium,
                                                     **_known(BlockRemoved,
                                                              {"group_idx": group})))
                    continue
                self._events.append(BlockRemoved(block_hashes=[key], medium=medium))

    def _group_stored(self, key: bytes, parent: Optional[bytes], tokens: List[int],
                      medium: str) -> KVCacheEvent:
        """BlockStored of a hybrid key: vLLM's block hash, and its group."""
        raw, group = self.groups.split(key)
        return BlockStored(block_hashes=[raw],
                           parent_block_hash=None if parent is None else
                           self.groups.split(parent)[0],
                           token_ids=tokens, block_size=self.block_size, lora_id=None,
                           medium=medium, lora_name=None,
                           **_known(BlockStored, self.groups.event_fields(group)))

    def reset_cache(self) -> bool:
        """vLLM's reset of the connector's cache: the index forgets every
        key at once (nothing more is matched), and the next step tells the
        workers to drop what G2 and G3 hold (their REMOVED events follow).
        G4 objects are kept: they outlive the engine and may be shared."""
        log.info("kvbm: reset_cache: %d keys forgotten; the workers drop G2 and G3 at the "
                 "next step (G4 is kept)", len(self._tiers))
        self._tiers.clear()
        self._tokens.clear()
        self._reset = True
        return True

    def take_stats(self) -> Optional[KvbmConnectorStats]:
        """The lookups since the last call (None: none)."""
        if self._stats.is_empty():
            return None
        stats, self._stats = self._stats, KvbmConnectorStats()
        return stats

    def take_events(self) -> Iterable[KVCacheEvent]:
        events, self._events = self._events, []
        return events

    def cached_tiers(self, key: bytes) -> Set[int]:
        """The tiers the index says hold key (for tests and stats)."""
        return set(self._tiers.get(key, ()))
