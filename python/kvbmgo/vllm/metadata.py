"""What the scheduler side tells the worker side each step, and what the
worker side tells back (cache events, to feed the scheduler's key index)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorMetadata,
                                                               KVConnectorWorkerMetadata)

__all__ = ["BlockLoad", "BlockStore", "KvbmConnectorMetadata", "KvbmWorkerMetadata",
           "RemoteSend", "RemotePull", "SYNC_FAILURE_STEPS"]


@dataclass
class BlockLoad:
    """Load keys[i] (vLLM block hashes) into G1 block block_ids[i].
    refused: why the scheduler side loads nothing of an async load vLLM
    counts on (the request is reported failed, failed_recving), or ""."""
    req_id: str
    keys: List[bytes]
    block_ids: List[int]
    is_async: bool = False
    refused: str = ""


#: For how many steps a failed sync load makes stores computed over its
#: blocks wrong: vLLM may run a step before it hears of the last one's
#: failures (async scheduling: 2 batches in flight; pipeline stages more).
#: Both sides use it: the scheduler names the blocks sync loads filled in
#: that many steps (depends_on), the worker remembers as long which failed.
SYNC_FAILURE_STEPS = 4


@dataclass
class BlockStore:
    """Offer G1 block block_ids[i], which holds keys[i], to the cache once
    this step's forward has written it. depends_on: the request's earlier
    G1 blocks that sync loads filled in the last SYNC_FAILURE_STEPS steps;
    if one of them failed, these blocks were computed over wrong KV and none
    of them is offered (vLLM uncomputes a failed block and every block after
    it)."""
    req_id: str
    keys: List[bytes]
    block_ids: List[int]
    depends_on: List[int] = field(default_factory=list)


@dataclass
class RemoteSend:
    """Prefill side: a finished request whose G1 blocks block_ids are held
    for a decode instance to pull (its kv_transfer_params name them).
    token: the request's secret (kv_transfer_params kvbm_token): only a
    decode that holds it can pull the blocks or release them."""
    req_id: str
    block_ids: List[int]
    token: str = ""


@dataclass
class RemotePull:
    """Decode side: pull remote_block_ids[i] of the prefill instance
    engine_id (its side channel at host:port, rank 0) into G1 block
    block_ids[i]. No block ids: only tell the prefill to let go. token:
    the request's secret (kv_transfer_params kvbm_token); worker_id: the
    prefill's rank-0 kvbm worker id when its config names one
    (kvbm_worker_id; None: derived from engine_id). refused: why nothing
    is pulled ("" when it is: pd_groups.pairs): the decode tells the
    prefill to let go and reports the request failed."""
    req_id: str
    engine_id: str
    remote_request_id: str
    host: str
    port: int
    tp_size: int
    remote_block_ids: List[int]
    block_ids: List[int]
    token: str = ""
    worker_id: Optional[int] = None
    refused: str = ""


@dataclass
class KvbmConnectorMetadata(KVConnectorMetadata):
    """One step's work for the worker side, built by the scheduler side."""
    loads: List[BlockLoad] = field(default_factory=list)
    stores: List[BlockStore] = field(default_factory=list)
    #: The G1 blocks vLLM handed to requests this step (it may reuse a
    #: finished request's blocks at once): a store still reading one of
    #: them is waited for before this step's loads and forward write them.
    allocated: List[int] = field(default_factory=list)
    #: Requests preempted this step: their G1 blocks may be reused now.
    preempted: List[str] = field(default_factory=list)
    #: Disaggregated prefill->decode: requests this prefill instance holds
    #: for decode instances, and pulls this decode instance starts.
    sends: List[RemoteSend] = field(default_factory=list)
    pulls: List[RemotePull] = field(default_factory=list)
    #: vLLM reset the connector's cache: drop what G2 and G3 hold, before
    #: this step's loads.
    reset_cache: bool = False
    #: The id of this step's stores (0: none): each worker says when they
    #: are over (KvbmWorkerMetadata.settled; stores_in_flight.py).
    store_batch: int = 0
    #: This step's number when the load policy times it (0: not timed): the
    #: workers send it back with the step's output (KvbmWorkerMetadata.step),
    #: so that the step is timed to its own output.
    timed_step: int = 0


#: A cache event as it crosses processes: (kind, tier, key); kind 1 stored,
#: 2 removed; tier 2 = G2, 3 = G3, 4 = G4. Kind 3 (LOST, tier 0): a load
#: found no block under key (several KV cache groups: vLLM then recomputes
#: the whole request and looks it up again, so the index must forget the key).
WireEvent = Tuple[int, int, bytes]
LOST = 3


#: (rates, queued, block bytes): KvbmWorkerMetadata.load.
LoadReport = Tuple[Tuple[float, ...], Tuple[float, ...], int]


@dataclass
class KvbmWorkerMetadata(KVConnectorWorkerMetadata):
    """The cache events a worker drained this step, in order, and the
    store batches (KvbmConnectorMetadata.store_batch) it saw end since the
    last step: their blocks' events are among these or earlier ones."""
    events: List[WireEvent] = field(default_factory=list)
    settled: List[int] = field(default_factory=list)
    #: What the cache measured of its loads lately, when it changed: (bytes
    #: per second by tier number, bytes in flight by tier, bytes of a block)
    #: for the load policy (load_policy "auto").
    load: Optional[LoadReport] = None
    #: The timed step (KvbmConnectorMetadata.timed_step) this output ends.
    step: int = 0

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KvbmWorkerMetadata":
        # Several ranks: their events, one after the other. The scheduler's
        # index is a mirror, and a block one rank lacks fails its load
        # (reported through get_block_ids_with_load_errors), never a wrong byte.
        # Loads: the slowest rank's (every rank loads its share at once).
        assert isinstance(other, KvbmWorkerMetadata)
        return KvbmWorkerMetadata(self.events + other.events, self.settled + other.settled,
                                  slowest(self.load, other.load), max(self.step, other.step))


def slowest(a: Optional[LoadReport], b: Optional[LoadReport]) -> Optional[LoadReport]:
    """Two ranks' load reports as one: each tier's lower measured rate and
    larger queue."""
    if a is None or b is None:
        return a if b is None else b
    rate = tuple(min(x, y) if x and y else (x or y) for x, y in zip(a[0], b[0]))
    return rate, tuple(max(x, y) for x, y in zip(a[1], b[1])), max(a[2], b[2])
