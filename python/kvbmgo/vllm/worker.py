"""The worker side of KvbmConnector: registers vLLM's KV cache as G1 (as
kv_views.py lays it out) and runs the loads and stores the scheduler side
put in the step's metadata on the worker's kvbm prefix cache, and a P/D
role's side channel (pd_prefill.py) or pulls (pd_decode.py). It decides
nothing: which blocks are loaded or offered is the scheduler side's
metadata, and what the cache keeps is the library's policy."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from .. import Event, Worker, _control
from ..errors import AlreadyExistsError, KvbmError
from .config import KvbmConfig, engine_worker_id
from .g3_dirs import make_g3_dir, persistent_g3_dir
from .groups import KvGroups
from .kv_views import check_block_count, g1_layout, local_kv
from .metadata import LOST, SYNC_FAILURE_STEPS, KvbmConnectorMetadata, KvbmWorkerMetadata
from .pd_wire import LABEL
from .worker_stats import WorkerStats

__all__ = ["KvbmWorker"]

log = logging.getLogger(__name__)

#: Why G1 is gone between unregister_kv_caches and restore_kv_caches.
_LENT = "vLLM lent the KV cache's memory away (sleep mode or a weight update)"

@dataclass
class _Store:
    """An offload in flight: its notification, the requests whose blocks it
    reads, those G1 blocks, (CUDA) the event its copies wait for, and the
    scheduler's id of its batch."""
    n: Any
    reqs: Set[str]
    ids: Set[int]
    ev: Any
    t0: float = 0.0  # time.monotonic() at its start
    batch: int = 0


class KvbmWorker(WorkerStats):
    def __init__(self, config: KvbmConfig, rank: int = 0, *, role: str = "kv_both",
                 engine_id: str = "", tp_size: int = 1, dp_index: int = 0,
                 kv_heads: int = 0, mla: bool = False,
                 groups: Optional[KvGroups] = None, persist_id: Optional[str] = None,
                 pp_rank: int = 0) -> None:
        """kv_heads: the model's KV heads over all ranks (0: unknown), mla:
        whether its KV is MLA's latent (replicated on every rank); with them a
        decode maps heads from a prefill of another tensor-parallel size.
        groups: the KV cache groups kept (None: one). persist_id: G3 is
        persistent (g3_persist), its keys those of this id (g3_dirs.py)."""
        self.config = config
        self.persist_id = persist_id
        # A persistent G3 is this (data-parallel, pipeline, tensor) rank's.
        self.persist_rank = f"dp{dp_index}-pp{pp_rank}-rank{rank}"
        self.groups = groups
        # Several KV cache groups: a failed load is reported as its request's
        # (failed_recving); vLLM refuses block ids with more than one group.
        self.hybrid = groups is not None and groups.hybrid
        self._failed_recving: Set[str] = set()
        # Hybrid: each async load's keys by G1 block, and the keys loads
        # did not find (sent to the scheduler as LOST events).
        self._load_keys: Dict[str, Dict[int, bytes]] = {}
        self._lost: List[bytes] = []
        self.kv_heads, self.mla = kv_heads, mla
        self._local: Optional[Any] = None  # kv_views.LocalKv, from register_kv_caches
        self.rank = rank
        self.role = role
        self.engine_id = engine_id
        self.tp_size = tp_size
        # P/D: this rank's side channel (a prefill), and its pulls (a decode).
        self.pd_port = config.pd_port + dp_index * tp_size + rank
        self._server: Optional[Any] = None
        self._puller: Optional[Any] = None
        self._key: Optional[Any] = None  # the side channel's (_control.KeyChoice)
        self.worker: Optional[Worker] = None
        self._g3_dir: Optional[str] = None
        self._layer_index: Dict[str, int] = {}
        self._events: List[Any] = []     # one per kvbm layer, for layer-wise loads
        self._cuda = False
        self._started = False  # start_load_kv ran for the bound metadata
        self._timed_step = 0  # a timed step run since build_worker_meta: said back with it
        # Sync loads of this step: (notification, G1 ids), or None.
        self._sync_load: Optional[Tuple[Any, List[int]]] = None
        self._async_loads: Dict[str, Tuple[Any, List[int]]] = {}
        self._stores: List[_Store] = []  # in flight
        self._settled: List[int] = []    # store batches over, for the scheduler
        # Requests vLLM holds for a decode instance that cannot pull them
        # (no side channel): reported in finished_sending at once.
        self._held: Set[str] = set()
        self._load_errors: Set[int] = set()
        self._sync_failed: Deque[Set[int]] = deque(maxlen=SYNC_FAILURE_STEPS)
        # Stats (stats.py): this interval's, the cache's counters at the
        # last look, when each load and pull started; _moved: something
        # started or ended since the last look.
        self._stats: Any = None
        self._cache_seen: Any = None
        self._started_at: Dict[str, Tuple[float, List[int]]] = {}
        self._moved = False
        self._looked = 0.0  # time.monotonic() of the last read of the cache's counters
        self._block_bytes = 0
        self._block_tokens = 0
        # G1 as registered (layout, buffers): registered again by
        # restore_kv_caches; _lent: unregister_kv_caches took it away.
        self._g1: Optional[Tuple[Any, List[Any]]] = None
        self._lent = False

    # ---- setup and teardown

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        # P/D across hosts without a key is refused before anything is made;
        # a P/D role's key is chosen now (kv_both: at its first P/D request,
        # which an offloading-only engine never has).
        if self.role in ("kv_producer", "kv_consumer"):
            self._pd_key()
        elif self.role == "kv_both":
            _control.refuse_unkeyed(LABEL, self._pd_hosts())
        if self.groups is not None and self.groups.inert is not None:
            # Nothing is kept (groups.py says why, once): no G1, no tiers;
            # the worker's calls then do nothing. Its views (Mamba state,
            # kernel-block attention) are not registered, so they cannot
            # fail the engine's start.
            log.info("kvbm: G1 is not registered: %s", self.groups.inert)
            return
        if self.groups is not None and self.groups.layer_names is not None:
            # Only the kept groups' layers are G1 (groups.py).
            kv_caches = {n: t for n, t in kv_caches.items() if n in self.groups.layer_names}
        check_block_count(kv_caches, self.groups.g1_blocks if self.groups is not None else 0)
        try:
            cfg, buffers, self._layer_index = g1_layout(kv_caches)
        except ValueError as e:
            if not self.hybrid:
                raise
            # kvbm registers G1 once over the groups' shared pages
            # (groups.py): a layer over another's must keep its blocks where
            # that one does.
            raise ValueError(f"{e}. This hybrid model's KV cache groups: "
                             f"{self.groups.shapes(kv_caches)}; kvbm registers their shared "
                             f"pages once, so their blocks must lie alike") from None
        self._local = local_kv(kv_caches, self._layer_index, self.rank, self.tp_size,
                               self.kv_heads, self.mla)
        self._block_bytes, self._block_tokens = cfg.block_bytes, cfg.page_size
        self._cuda = buffers[0].device is not None
        c = self.config
        g2, g3 = c.tier_blocks(cfg.block_bytes)
        g4_dir = os.path.join(c.g4_dir, f"rank{self.rank}") if c.g4_dir else None
        persist = None
        if c.g3_dir is not None and self.persist_id is not None:
            self._g3_dir = persistent_g3_dir(c.g3_dir, self.persist_rank)
            # G1's layout but its block count (vLLM sizes G1 from the memory
            # it finds free: it may differ between runs of one model).
            persist = f"{self.persist_id} {self.persist_rank} g1={cfg.replace(num_blocks=0)}"
        elif c.g3_dir is not None:
            self._g3_dir = make_g3_dir(c.g3_dir, self.rank)
        wid = (c.worker_id if c.worker_id is not None else engine_worker_id(self.engine_id)) \
            + self.rank
        for attempt in range(64):
            try:
                # A prefill's data plane listens (from its first export)
                # where its side channel does: the host decodes dial.
                w = Worker(wid + attempt * 0x10000,
                           device_id=buffers[0].device or 0, rank=self.rank,
                           disk_dir=self._g3_dir, object_dir=g4_dir,
                           advertise_host=c.pd_host, g3_persist_id=persist)
                break
            except AlreadyExistsError:
                continue
        else:
            raise AlreadyExistsError(f"no free kvbm worker id from {wid}")
        self.worker = w
        try:
            w.register_g1(cfg, buffers)
            self._g1 = (cfg, buffers)
            host = cfg.replace(layout="fully_contiguous")
            w.allocate_g2(host.replace(num_blocks=g2))
            if g3:
                w.allocate_g3(host.replace(num_blocks=g3))
            w.enable_cache(admit_after=c.admit_after, g3=c.g3_mode, g4=c.g4_mode,
                           max_events=c.max_events)
            self._cache_seen = w.cache.stats()  # the stats' first deltas are from here
            if self._cuda:
                import torch
                self._events = [torch.cuda.Event() for _ in range(cfg.num_layers)]
                for e in self._events:
                    e.record()  # torch creates the CUevent at its first record
            else:
                self._events = [Event() for _ in range(cfg.num_layers)]
        except BaseException:
            self.shutdown()
            raise
        log.info("kvbm: G1 %s, G2 %d blocks, G3 %d blocks%s", cfg, g2, g3,
                 ", G4 " + g4_dir if g4_dir else "")
        if self.role == "kv_producer":
            # A prefill instance's side channel is up before its first request.
            self._prefill_server()

    def unregister_kv_caches(self) -> None:
        """vLLM lends the KV cache's memory away (sleep mode, a weight
        update): the stores and loads in flight on it are waited for, the
        requests held for a decode instance are let go (their KV is about
        to be overwritten; a decode's pull of one is refused, saying why),
        and G1 is unregistered: from then on nothing of kvbm reads or writes
        that memory, and a peer's pull through metadata handed out before is
        refused with the reason. Idempotent."""
        if self._lent or self.worker is None:
            return
        for st in self._stores:
            self._store_done(st)
        self._stores = []
        for n, _ in self._async_loads.values():
            if n is not None:
                try:
                    n.wait()  # reported (and closed) at the next get_finished
                except KvbmError:
                    pass
        if self._sync_load is not None:
            self._load_errors.update(self._finish(self._sync_load[0]))
            self._sync_load = None
        if self._server is not None:
            self._server.suspend(_LENT)
        try:
            self.worker.unregister_g1(_LENT)
        except KvbmError as e:
            # Past its start G1 is unregistered all the same (what failed is
            # undoing a registration of the memory): restore registers it.
            log.error("kvbm: unregistering G1: %s", e)
        self._lent = True
        log.info("kvbm: G1 unregistered: %s", _LENT)

    def restore_kv_caches(self) -> None:
        """The KV cache's memory is back (at the addresses it had): G1 is
        registered again, with a new handle, and a prefill's side channel
        hands metadata of the new registration. Idempotent."""
        if not self._lent or self.worker is None or self._g1 is None:
            return
        cfg, buffers = self._g1
        self.worker.register_g1(cfg, buffers)
        self._lent = False
        if self._server is not None:
            from .pd_prefill import pd_metadata
            self._server.resume(pd_metadata(self.worker))
        log.info("kvbm: G1 registered again")

    def _pd_hosts(self) -> List[str]:
        """The addresses this rank's side channel listens on (a prefill's
        pd_host) or may dial (a decode's pd_allow_hosts)."""
        c = self.config
        hosts = [c.pd_host] if self.role != "kv_consumer" else []
        return hosts + (list(c.pd_allow_hosts or ()) if self.role != "kv_producer" else [])

    def _pd_key(self) -> Any:
        """The side channel's key (_control.choose_key), chosen once."""
        if self._key is None:
            self._key = _control.choose_key(LABEL, self._pd_hosts())
        return self._key

    def _prefill_server(self) -> Any:
        """The side channel decode workers pull through (kv_both: started by
        the first request held for a decode instance)."""
        if self._server is None:
            from .pd_prefill import PrefillServer, pd_metadata, pd_request_metadata, pd_revoke
            w = self.worker
            self._server = PrefillServer(pd_metadata(w), self.engine_id,
                                         self.config.pd_host, self.pd_port,
                                         self.config.pd_hold_s,
                                         None if self._local is None else self._local.describe(),
                                         scoped=lambda ids, s: pd_request_metadata(w, ids, s),
                                         revoke=lambda ids: pd_revoke(w, ids),
                                         key=self._pd_key(),
                                         max_lease_s=self.config.pd_max_lease_s)
        return self._server

    def _decode_puller(self) -> Any:
        if self._puller is None:
            from .pd_decode import DecodePuller
            c = self.config
            self._puller = DecodePuller(self.worker, self.rank, self.tp_size, c.pd_timeout_s,
                                        c.pd_max_pulls, c.pd_allow_hosts, local=self._local,
                                        engine_id=self.engine_id, key=self._pd_key(),
                                        by_request=self.hybrid)
        return self._puller

    def shutdown(self) -> None:
        """Waits for the transfers in flight, then releases the worker, its
        tiers and its events. A prefill's side channel closes first: decode
        instances' pulls from it then fail (within their deadline)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._puller is not None:
            self._puller.close()
            self._puller = None
        for st in self._stores:
            self._finish(st.n)
        self._stores = []
        for n, _ in self._async_loads.values():
            self._finish(n)
        self._async_loads = {}
        if self._sync_load is not None:
            self._finish(self._sync_load[0])
            self._sync_load = None
        if not self._cuda:
            for e in self._events:
                e.close()
        self._events = []
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        if self._g3_dir is not None and self.persist_id is None:  # a persistent one stays
            shutil.rmtree(self._g3_dir, ignore_errors=True)
        self._g3_dir = None

    # ---- each step

    def _event_handle(self, e: Any) -> Any:
        return e.cuda_event if self._cuda else e

    def bind(self) -> None:
        """A step's metadata was bound."""
        self._started = False

    def start_load_kv(self, md: KvbmConnectorMetadata) -> None:
        """Starts this step's loads: the sync ones layer by layer (one event
        per layer, which wait_for_layer_load waits on), the async ones whole."""
        if self._started:
            return
        self._started = True
        self._timed_step = md.timed_step or self._timed_step
        if self.worker is None:
            # Before register_kv_caches or after shutdown (vLLM's
            # no-forward path): nothing moves. Loads and pulls fail, every
            # block (an async one is reported finished, with its errors, at
            # the next get_finished); requests to hold go back to vLLM.
            self._held.update(send.req_id for send in md.sends)
            loads = [(p.req_id, p.block_ids, True) for p in md.pulls]
            loads += [(ld.req_id, ld.block_ids, ld.is_async) for ld in md.loads]
            for req_id, ids, is_async in loads:
                self._load_errors.update(ids)
                if ids and is_async:
                    self._async_loads[req_id] = (None, list(ids))
            return
        if md.reset_cache:
            try:
                g2, g3 = self.worker.cache.reset()
                log.info("kvbm: reset_cache: %d G2 and %d G3 blocks dropped (G4 kept)", g2, g3)
            except KvbmError as e:
                log.warning("kvbm: reset_cache: %s", e)
        for send in md.sends:
            try:
                self._prefill_server().hold(send.req_id, send.token, send.block_ids)
            except (OSError, ValueError) as e:
                # No side channel (kv_both: its port is taken, or no key): nobody
                # can pull, so the blocks go back to vLLM with the stores' hold.
                log.error("kvbm: request %s cannot be held for a decode instance: %s",
                          send.req_id, e)
                self._held.add(send.req_id)
        now = time.monotonic()
        for pull in md.pulls:
            try:
                puller = self._decode_puller()
            except ValueError as e:
                # kv_both: no key for the side channel (chosen at the first
                # pull): the pull fails, reported at the next get_finished.
                log.error("kvbm: request %s cannot be pulled: %s", pull.req_id, e)
                self._load_errors.update(pull.block_ids)
                self._async_loads[pull.req_id] = (None, list(pull.block_ids))
                continue
            puller.start(pull)
            if pull.block_ids:
                self._started_at["pull:" + pull.req_id] = (now, list(pull.block_ids))
                self._moved = True
        keys: List[bytes] = []
        ids: List[int] = []
        for ld in md.loads:
            if ld.is_async:
                self._started_at[ld.req_id] = (now, [])
                if self.hybrid:
                    self._load_keys[ld.req_id] = dict(zip(ld.block_ids, ld.keys))
                n = None if ld.refused else self._onboard(ld.keys, ld.block_ids, None)
                self._async_loads[ld.req_id] = (n, list(ld.block_ids))  # None: fails
            else:
                keys.extend(ld.keys)
                ids.extend(ld.block_ids)
        if keys:
            events = [self._event_handle(e) for e in self._events]
            self._started_at[""] = (now, [])
            self._sync_load = (self._onboard(keys, ids, events), ids)

    def _onboard(self, keys: List[bytes], ids: List[int], events: Optional[List[Any]]) -> Any:
        try:
            stream = None
            if self._cuda and events is not None:
                import torch
                stream = torch.cuda.current_stream().cuda_stream
            return self.worker.cache.onboard(keys, ids, layer_events=events, stream=stream)
        except (KvbmError, ValueError) as e:
            # Nothing started: every block of the load failed.
            log.warning("kvbm: load of %d blocks refused: %s", len(ids), e)
            self._load_errors.update(ids)
            return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._sync_load is None or self._sync_load[0] is None:
            return
        i = self._layer_index.get(layer_name)
        if i is None:
            return
        e = self._events[i]
        if self._cuda:
            import torch
            torch.cuda.current_stream().wait_event(e)
        else:
            e.synchronize()

    def _finish(self, n: Any) -> List[int]:
        """Waits for n and closes it; the blocks that failed."""
        if n is None:
            return []
        with n:
            try:
                n.wait()
            except KvbmError:
                pass
            return n.failed_blocks()

    def wait_for_save(self, md: KvbmConnectorMetadata) -> None:
        """Ends the step's sync loads (their failures are reported by
        get_block_ids_with_load_errors), then offers the blocks this step
        completed to the cache, after the forward's writes (on CUDA: after
        an event recorded on the current stream; the copies wait for it)."""
        self.start_load_kv(md)  # a step whose start_load_kv was not called
        now_failed: Set[int] = set()  # G1 blocks this step's sync loads did not fill
        if self._sync_load is not None:
            n, ids = self._sync_load
            now_failed = set(ids) if n is None else set(self._finish(n))
            self._load_errors.update(now_failed)
            self._sync_load = None
            self._ended("load_seconds", "")
        # ... and those of the steps before (see SYNC_FAILURE_STEPS).
        self._sync_failed.append(now_failed)
        failed = set().union(*self._sync_failed)
        if not md.stores:
            return
        if self.worker is None:
            self._settle(md.store_batch)
            return
        keys: List[bytes] = []
        ids: List[int] = []
        reqs: Set[str] = set()
        seen: Set[bytes] = set()
        for st in md.stores:
            if failed and not failed.isdisjoint(st.depends_on):
                # Computed this step over a block that failed to load: wrong
                # KV, never cached (vLLM computes them again, and they are
                # offered again then).
                log.info("kvbm: request %s: %d blocks computed over a failed load are "
                         "not stored", st.req_id, len(st.block_ids))
                self._stat().add("failed_blocks", len(st.block_ids), "computed_over_failed_load")
                continue
            reqs.add(st.req_id)
            for k, b in zip(st.keys, st.block_ids):
                if k not in seen:  # two requests with one prefix: store it once
                    seen.add(k)
                    keys.append(k)
                    ids.append(b)
        if not keys:
            self._settle(md.store_batch)
            return
        ev: Any = None
        if self._cuda:
            import torch
            ev = torch.cuda.Event()
            ev.record()
        try:
            n, _ = self.worker.cache.offload(keys, ids, precondition=None if ev is None
                                             else ev.cuda_event)
        except (KvbmError, ValueError) as e:
            log.warning("kvbm: offload of %d blocks refused: %s", len(ids), e)
            self._settle(md.store_batch)
            return
        self._stores.append(_Store(n, reqs, set(ids), ev, time.monotonic(), md.store_batch))
        self._moved = True
        if self.groups is not None and self.groups.zeroed:
            # vLLM zeroes the blocks it hands out at the next step's start,
            # before handle_preemptions could wait for a store reading one.
            for st in self._stores:
                self._store_done(st)
            self._stores = []

    def handle_preemptions(self, md: KvbmConnectorMetadata) -> None:
        """Called by vLLM at the start of every step, before its loads and
        forward: the G1 blocks of preempted requests, and blocks vLLM handed
        to a request this step (a finished request's blocks are reused at
        once), are written this step, so the stores still reading them are
        waited for first."""
        if not self._stores or not (md.preempted or md.allocated):
            return
        pre = set(md.preempted)
        allocated = set(md.allocated)
        keep = []
        for st in self._stores:
            if not st.n.done() and (st.reqs & pre or not allocated.isdisjoint(st.ids)):
                self._store_done(st)
            else:
                keep.append(st)
        self._stores = keep

    def get_finished(self) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        """(requests held for a decode instance that it is done with, and
        whose stores are done; async loads done)."""
        keep = []
        pending: Set[str] = set()
        for st in self._stores:
            if st.n.done():
                self._store_done(st)
            else:
                keep.append(st)
                pending |= st.reqs
        self._stores = keep
        held = self._held
        if self._server is not None:
            # A request held for a decode instance is sent once that is done
            # with it (and its own stores, if any, are read).
            held |= self._server.take_released()
            pending |= self._server.held()
        sending = {r for r in held if r not in pending}
        self._held = held - sending
        recving: Set[str] = set()
        if self._puller is not None:
            pulled, failed = self._puller.finished()
            recving |= pulled
            self._load_errors.update(failed)
            for req_id in pulled:
                self._pulled(req_id, failed)
            # Failed as requests (several groups, or refused: pd_groups.py).
            reqs, ids = self._puller.take_failed_requests()
            self._failed_recving |= reqs
            self._load_errors.difference_update(ids)
        for req_id, (n, ids) in list(self._async_loads.items()):
            if n is None or n.done():
                failed = self._finish(n)
                if self.hybrid:
                    # n None: refused or never started, every block failed
                    # (those ids are in _load_errors: they are its, not
                    # the step's).
                    keys = self._load_keys.pop(req_id, {})
                    if n is None or failed:
                        self._failed_recving.add(req_id)
                        self._load_errors.difference_update(ids)
                        self._lost.extend(keys[b] for b in (ids if n is None else failed)
                                          if b in keys)
                else:
                    self._load_errors.update(failed)
                del self._async_loads[req_id]
                self._ended("load_seconds", req_id)
                recving.add(req_id)
        return sending or None, recving or None

    def _store_done(self, st: "_Store") -> None:
        failed = self._finish(st.n)
        self._stat().observe("store_seconds", time.monotonic() - st.t0)
        self._moved = True
        self._settle(st.batch)
        if failed:
            log.info("kvbm: %d blocks not offloaded: %s", len(failed), failed)

    def _settle(self, batch: int) -> None:
        """The store batch is over: what landed is among the cache's events."""
        if batch:
            self._settled.append(batch)

    def take_failed_recving(self) -> Set[str]:
        """The requests (of those get_finished reported received) whose
        load failed, with several KV cache groups."""
        failed, self._failed_recving = self._failed_recving, set()
        return failed

    def get_block_ids_with_load_errors(self) -> Set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def build_worker_meta(self) -> Optional[KvbmWorkerMetadata]:
        lost, self._lost = self._lost, []
        settled, self._settled = self._settled, []
        # After the batches' ends: their blocks' events are drained too.
        events = self.worker.cache.events() if self.worker is not None else []
        load = self._load_news()
        step, self._timed_step = self._timed_step, 0
        if not events and not lost and not settled and load is None and not step:
            return None
        return KvbmWorkerMetadata([(int(e.kind), int(e.tier), e.key) for e in events] +
                                  [(LOST, 0, k) for k in lost], settled, load, step)
