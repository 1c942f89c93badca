"""One prefill -> decode hand-off as the decode side drives it: the P/D
driver under both engine integrations (vLLM's ``DecodePuller``, SGLang's
``kvbm`` transfer backend).

A ``Handoff`` owns the hand-off's coordinator and runs its actions, in the
order of etcd-io/raft's RawNode loop: an action is executed, its outcome
stepped into the coordinator, then the actions that come back; a fact (the
engine's, or the end of a transfer) is stepped once the actions in hand
are done. What is engine-specific (the side channel, the engine's request
status, where the pages are) is a ``HandoffSide``'s.

What the driver does itself:

- ReserveDestination: both engines reserve the destination blocks before
  the hand-off starts (vLLM before it asks for the load, SGLang before
  ``send_metadata``): Accepted, then DestinationReserved.
- StartTransfer: the side starts its pulls with ``Handoff.pull``, which
  passes the hand-off's deadline to the library (``deadline=``: a pull
  still running then is canceled in Go, its blocks fail); the driver waits
  for them (inline, or on an executor) and steps TransferCompleted,
  Failed or TimedOut. The blocks the library reports failed are
  ``failed_blocks``.
- CancelDestination: every pull of the hand-off is canceled through the
  library and waited for before the side gives the blocks back to the
  engine: after that the library writes none of them.

A hand-off is used from any thread: ``lock`` (re-entrant) serialises it,
and a side may hold it to keep its own state with the hand-off's.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Executor
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from ._handoff import (Action, ActionKind, Completion, FactKind, HandoffCoordinator,
                       OutcomeKind)
from ._layout import Tier
from ._notification import Notification
from .errors import DeadlineExceededError, KvbmError

__all__ = ["Handoff", "HandoffSide", "HandoffRefused"]

log = logging.getLogger(__name__)

#: How long past the deadline a pull may still run before it is canceled
#: here (the library cancels its operations on the peer at the deadline;
#: this only bounds a pull with none).
_GRACE_S = 1.0
#: The deadline given to a pull started when the hand-off's has passed
#: (the library takes none shorter than a millisecond).
_PAST_DEADLINE_S = 0.001


class HandoffRefused(Exception):
    """A step of the hand-off cannot be done; the message says why (the
    action is reported Failed with it)."""


class HandoffSide:
    """What an engine does for a hand-off's actions. Each method runs with
    the hand-off's lock held; one that raises HandoffRefused reports its
    action Failed with the message. A method may step facts
    (``Handoff.fact``): they are stepped after the action's outcome. The
    defaults do nothing and report success."""

    def submit_prefill(self, h: "Handoff") -> None:
        """The prefill is asked to run (or ran already)."""

    def start_transfer(self, h: "Handoff") -> None:
        """Starts the pulls left (``h.pull``); the driver waits for them."""

    def activate_destination(self, h: "Handoff") -> None:
        """The destination blocks hold the prefill's KV: the engine may use them."""

    def release_source(self, h: "Handoff") -> OutcomeKind:
        """Tells the prefill it may let go: APPLIED, NOOP or FAILED."""
        return OutcomeKind.APPLIED

    def cancel_source(self, h: "Handoff") -> OutcomeKind:
        """Tells the prefill the hand-off is off: APPLIED or NOOP."""
        return OutcomeKind.APPLIED

    def cancel_destination(self, h: "Handoff") -> None:
        """The hand-off failed (``h.reason`` says why): the engine gets its
        blocks back. The pulls have ended when this runs."""


class Handoff:
    """One hand-off from the decode side (see the module's documentation).
    ``deadline`` is a ``time.monotonic()`` time bounding every pull; name
    (e.g. "kvbm: pull of request R from engine E") starts the messages and
    logs of its pulls, bound (e.g. "its 10.0 s deadline") says what the
    deadline is in the message of one that outlasts it. With executor, the
    pulls are awaited there; without, by the thread that started them."""

    def __init__(self, order: int, side: HandoffSide, deadline: float, *, name: str,
                 bound: str, executor: Optional[Executor] = None) -> None:
        self.lock = threading.RLock()
        self.coordinator = HandoffCoordinator(uuid.uuid4(), order)
        self.name = name
        #: Why the hand-off failed (the first reason given), or None.
        self.reason: Optional[str] = None
        #: How it ended: Completion.NONE until it did.
        self.completion = Completion.NONE
        #: The destination blocks the library reported failed.
        self.failed_blocks: Set[int] = set()
        #: The error of a pull that failed (not one that outlasted the deadline).
        self.transfer_error: Optional[KvbmError] = None
        self._side = side
        self._deadline = deadline
        self._bound = bound
        self._executor = executor
        self._pulls: List[Notification] = []   # every pull started, until close()
        self._unawaited: List[Notification] = []  # started before StartTransfer
        self._facts: Deque[Tuple[FactKind, Dict[str, Any]]] = deque()
        self._driving = False

    @property
    def complete(self) -> bool:
        """True once the hand-off ended (or was closed)."""
        return self.completion != Completion.NONE or self.coordinator.closed

    def start(self) -> None:
        """Starts the hand-off and runs what follows."""
        with self.lock:
            self._run(self.coordinator.start())

    def fact(self, kind: FactKind, reason: Optional[str] = None, **timing: Any) -> None:
        """Steps fact kind (timing: HandoffCoordinator.on_fact's fields) and
        runs what follows; reason: why it failed, kept as ``reason`` when it
        is the first. Nothing once the hand-off ended. From inside a side's
        method, the fact waits until that action's outcome is stepped."""
        with self.lock:
            if self.complete:
                return
            if reason is not None and self.reason is None:
                self.reason = reason
            self._facts.append((kind, timing))
            if not self._driving:
                self._run([])

    def fail(self, why: str) -> None:
        """A pull of the hand-off could not start (outside StartTransfer):
        steps Failed, with "name: why" as the reason (logged)."""
        why = f"{self.name}: {why}"
        log.warning("%s", why)
        self.fact(FactKind.FAILED, why)

    def pull(self, worker: Any, instance: int, src_ids: Any, dst_ids: Any, *,
             heads: Any = None) -> Notification:
        """Starts pulling blocks src_ids of connected instance's G1 into
        worker's G1 blocks dst_ids (heads: a kvbmgo.HeadSlice of each block,
        or None for whole blocks), bounded by the hand-off's deadline. Its
        end is awaited at StartTransfer (a pull started earlier overlaps the
        prefill's next chunks); CancelDestination cancels it. Raises as
        Worker.transfer_from_instance."""
        left = max(self._deadline - time.monotonic(), _PAST_DEADLINE_S)
        n = worker.transfer_from_instance(instance, Tier.G1, src_ids, Tier.G1, dst_ids,
                                          deadline=left, heads=heads)
        with self.lock:
            self._pulls.append(n)
            self._unawaited.append(n)
        return n

    def close(self) -> None:
        """Cancels the pulls still running and waits until they ended (then
        nothing writes the destination blocks), then frees the coordinator
        and the pulls' notifications."""
        with self.lock:
            self.coordinator.close()
            self._cancel_pulls()
            for n in self._pulls:
                n.close()
            self._pulls, self._unawaited = [], []

    # ---- the loop (lock held)

    def _run(self, actions: List[Action]) -> None:
        """Executes actions and what follows from them, then the facts
        stepped meanwhile, until there is nothing left to do."""
        todo: Deque[Action] = deque(actions)
        self._driving = True
        try:
            while True:
                while todo:
                    a = todo.popleft()
                    if a.kind == ActionKind.COMPLETE:
                        self.completion = a.completion
                        log.debug("%s: hand-off %s", self.name, a.completion.name)
                        continue
                    outcome, message = self._execute(a)
                    todo.extendleft(reversed(self.coordinator.on_outcome(a.id, outcome,
                                                                         message)))
                if not self._facts or self.complete:
                    self._facts.clear()
                    return
                kind, timing = self._facts.popleft()
                todo.extend(self._step(kind, timing))
        finally:
            self._driving = False

    def _step(self, kind: FactKind, timing: Dict[str, Any]) -> List[Action]:
        try:
            return self.coordinator.on_fact(kind, **timing)
        except KvbmError as e:
            if kind == FactKind.FAILED:  # the coordinator takes no failure now
                log.error("%s: %s", self.name, e)
                self._cancel_destination()
                return []
            self.reason = self.reason or f"hand-off out of order ({kind.name}: {e})"
            return self.coordinator.on_fact(FactKind.FAILED)

    def _execute(self, a: Action) -> Tuple[OutcomeKind, Optional[str]]:
        """Does action a: (its outcome, why it failed)."""
        k, side = a.kind, self._side
        try:
            if k == ActionKind.RESERVE_DESTINATION:
                self._facts.append((FactKind.DESTINATION_RESERVED, {}))
                return OutcomeKind.ACCEPTED, None
            if k == ActionKind.SUBMIT_PREFILL:
                side.submit_prefill(self)
                return OutcomeKind.SUBMITTED, None
            if k == ActionKind.START_TRANSFER:
                return self._start_transfer()
            if k == ActionKind.ACTIVATE_DESTINATION:
                side.activate_destination(self)
                return OutcomeKind.APPLIED, None
            if k == ActionKind.RELEASE_SOURCE:
                return side.release_source(self), None
            if k == ActionKind.CANCEL_SOURCE:
                return side.cancel_source(self), None
            if k == ActionKind.CANCEL_DESTINATION:
                self._cancel_destination()
                return OutcomeKind.APPLIED, None
        except HandoffRefused as e:
            self.reason = self.reason or str(e)
            return OutcomeKind.FAILED, str(e)
        raise AssertionError(f"unexpected hand-off action {a}")

    def _start_transfer(self) -> Tuple[OutcomeKind, Optional[str]]:
        try:
            self._side.start_transfer(self)
        except (HandoffRefused, KvbmError, ValueError, TypeError) as e:
            why = f"{self.name}: {e}"
            log.warning("%s", why)
            self.reason = self.reason or why
            return OutcomeKind.FAILED, why
        notes, self._unawaited = self._unawaited, []
        if not notes:
            self._facts.append((FactKind.TRANSFER_COMPLETED, {}))
        elif self._executor is None:
            self._await(notes)
        else:
            try:
                self._executor.submit(self._await, notes)
            except RuntimeError:  # the executor is shutting down
                for n in notes:
                    n.cancel()
                why = f"{self.name}: closing"
                self.reason = self.reason or why
                return OutcomeKind.FAILED, why
        return OutcomeKind.SCHEDULED, None

    # ---- the pulls

    def _await(self, notes: List[Notification]) -> None:
        """Waits until every pull in notes ended; steps how they went."""
        fact, why = FactKind.TRANSFER_COMPLETED, None
        for n in notes:
            kind, err = self._end_of(n)
            if kind == FactKind.TRANSFER_COMPLETED or fact != FactKind.TRANSFER_COMPLETED:
                continue
            fact = kind
            if kind == FactKind.TIMED_OUT:
                why = f"{self.name} did not finish within {self._bound}"
            else:
                bad = sorted(self.failed_blocks)
                why = f"{self.name} failed: {err}" + (f" (blocks {bad[:8]})" if bad else "")
                self.transfer_error = err
            log.warning("%s", why)
        self.fact(fact, why)

    def _end_of(self, n: Notification) -> Tuple[FactKind, Optional[KvbmError]]:
        """Waits until pull n ended: TRANSFER_COMPLETED, TIMED_OUT (past the
        deadline) or FAILED (with the error)."""
        try:
            if n.wait(max(0.0, self._deadline - time.monotonic()) + _GRACE_S):
                return FactKind.TRANSFER_COMPLETED, None
        except KvbmError as e:
            self._note_failed_blocks(n)
            if isinstance(e, DeadlineExceededError):  # the library's word, not our clock
                return FactKind.TIMED_OUT, e
            return FactKind.FAILED, e
        except ValueError:  # closed under us: the hand-off is over
            return FactKind.FAILED, None
        self._wait_out(n)  # ran past the deadline: never trusted
        return FactKind.TIMED_OUT, None

    def _note_failed_blocks(self, n: Notification) -> None:
        try:
            bad = n.failed_blocks()
        except (KvbmError, ValueError):
            return
        with self.lock:
            self.failed_blocks.update(bad)

    def _wait_out(self, n: Notification) -> None:
        """Cancels pull n and waits until it ended (after that nothing writes
        its destination blocks)."""
        try:
            n.cancel()
            while not n.wait(1.0):
                log.warning("%s: waiting for the canceled pull to end before its blocks go "
                            "back", self.name)
        except KvbmError:
            self._note_failed_blocks(n)
        except ValueError:  # closed: the hand-off is over
            pass

    def _cancel_pulls(self) -> None:
        """Cancels every pull that has not ended and waits until it has."""
        for n in self._pulls:
            try:
                if not n.done():
                    n.cancel()
            except (KvbmError, ValueError):  # closed already
                pass
        for n in self._pulls:
            self._wait_out(n)

    def _cancel_destination(self) -> None:
        self._cancel_pulls()
        self._side.cancel_destination(self)
