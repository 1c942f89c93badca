"""One prefill -> decode hand-off as a pure state machine."""

from __future__ import annotations

import enum
import uuid
from ctypes import byref, c_int32, c_size_t, c_void_p, sizeof
from typing import Any, List, NamedTuple, Optional, Union

from . import _lib
from ._cint import int32, uint64
from ._handle import Handle
from ._lib import KVBM_HANDOFF_MAX_ACTIONS, lib

__all__ = ["HandoffOrder", "FactKind", "TimingMode", "ActionKind", "OutcomeKind", "Completion",
           "Action", "HandoffCoordinator"]


class HandoffOrder(enum.IntEnum):
    SOURCE_FIRST = 1       # vLLM
    DESTINATION_FIRST = 2  # SGLang


class FactKind(enum.IntEnum):
    SOURCE_HELD = 1
    DESTINATION_RESERVED = 2
    TRANSFER_COMPLETED = 3
    FAILED = 4
    TIMED_OUT = 5
    CANCELED = 6


class TimingMode(enum.IntEnum):
    FULL_PROMPT = 1
    DESTINATION_MISSING = 2


class ActionKind(enum.IntEnum):
    SUBMIT_PREFILL = 1        # report SUBMITTED or FAILED
    RESERVE_DESTINATION = 2   # report ACCEPTED or FAILED
    START_TRANSFER = 3        # report SCHEDULED or FAILED
    ACTIVATE_DESTINATION = 4  # report APPLIED or FAILED
    RELEASE_SOURCE = 5        # report APPLIED, NOOP or FAILED
    CANCEL_SOURCE = 6         # report APPLIED or NOOP
    CANCEL_DESTINATION = 7    # report APPLIED or NOOP
    COMPLETE = 8              # over; see completion


class OutcomeKind(enum.IntEnum):
    SUBMITTED = 1
    ACCEPTED = 2
    SCHEDULED = 3
    APPLIED = 4
    NOOP = 5
    FAILED = 6


class Completion(enum.IntEnum):
    NONE = 0
    SUCCESS = 1
    CANCELED = 2


class Action(NamedTuple):
    """An action for the driver; report its outcome under ``id``."""
    id: int
    kind: ActionKind
    completion: Completion
    delay_ms: float
    handoff_id: bytes


def _handoff_id(hid: Union[bytes, bytearray, uuid.UUID]) -> bytes:
    b = hid.bytes if isinstance(hid, uuid.UUID) else bytes(hid)
    if len(b) != 16:
        raise ValueError(f"a hand-off id is 16 bytes, got {len(b)}")
    return b


class HandoffCoordinator(Handle):
    """One prefill -> decode hand-off as a pure state machine: facts and action
    outcomes in, actions (lists of Action) out. Calls are serialised by the
    library; the driver decides their order."""

    __slots__ = ("id",)
    _kind = "HandoffCoordinator"

    def __init__(self, handoff_id: Union[bytes, uuid.UUID], order: int,
                 fallback_delay_ms: float = 0.0) -> None:
        """Creates the coordinator of handoff_id (16 bytes or a UUID) in order;
        fallback_delay_ms is the START_TRANSFER delay when the timing gives
        none. Raises ValueError (id length), InvalidArgumentError (order,
        delay; order does not fit an int32), TypeError."""
        self.id = _handoff_id(handoff_id)
        order = int32(order, "order")
        h = c_void_p()
        lib.kvbm_handoff_new(self.id, order, fallback_delay_ms, byref(h))
        self._own(h.value, lib.kvbm_handoff_free)

    @staticmethod
    def _actions(acts: Any, n: int) -> List[Action]:
        return [Action(a.id, ActionKind(a.kind), Completion(a.completion), a.delay_ms,
                       bytes(a.handoff_id)) for a in acts[:n]]

    def start(self) -> List[Action]:
        """Starts the hand-off; returns the actions to execute, in order."""
        acts, n = _lib.ActionArray(), c_size_t()
        lib.kvbm_handoff_start(self.handle, acts, KVBM_HANDOFF_MAX_ACTIONS, byref(n))
        return self._actions(acts, n.value)

    def on_fact(self, kind: int, *, timing_mode: int = TimingMode.FULL_PROMPT,
                full_prompt_tokens: int = 0, kv_bytes_per_token: Optional[int] = None,
                bandwidth_gbs: Optional[float] = None,
                transferable_tokens: int = 0) -> List[Action]:
        """Applies a fact (timing_* fields are read for SOURCE_HELD,
        transferable_tokens for DESTINATION_RESERVED); returns the actions.
        Raises InvalidArgumentError (unknown kind, invalid timing; kind or
        timing_mode does not fit an int32, a token count a uint64),
        TypeError, FailedPreconditionError (a fact out of order)."""
        f = _lib.HandoffFactC()
        f.struct_size = sizeof(f)
        f.kind, f.timing_mode = int32(kind, "kind"), int32(timing_mode, "timing_mode")
        f.handoff_id[:] = self.id
        f.full_prompt_tokens = uint64(full_prompt_tokens, "full_prompt_tokens")
        f.transferable_tokens = uint64(transferable_tokens, "transferable_tokens")
        if kv_bytes_per_token is not None:
            f.kv_bytes_per_token = uint64(kv_bytes_per_token, "kv_bytes_per_token")
            f.has_kv_bytes_per_token = 1
        if bandwidth_gbs is not None:
            f.bandwidth_gbs, f.has_bandwidth_gbs = bandwidth_gbs, 1
        acts, n = _lib.ActionArray(), c_size_t()
        lib.kvbm_handoff_on_fact(self.handle, byref(f), acts, KVBM_HANDOFF_MAX_ACTIONS, byref(n))
        return self._actions(acts, n.value)

    def on_outcome(self, action_id: int, outcome: int,
                   message: Optional[str] = None) -> List[Action]:
        """Reports how action action_id went (message: why it FAILED); returns
        the actions. Raises NotFoundError (no such action), AlreadyExistsError
        (a different outcome reported), InvalidArgumentError (an outcome the
        action does not take), FailedPreconditionError (a cancel reported
        FAILED: retry it); InvalidArgumentError or TypeError for an
        action_id that is not a uint64, an outcome that is not an int32."""
        action_id, outcome = uint64(action_id, "action_id"), int32(outcome, "outcome")
        acts, n = _lib.ActionArray(), c_size_t()
        lib.kvbm_handoff_on_outcome(self.handle, action_id, outcome,
                                    message.encode() if message is not None else None,
                                    acts, KVBM_HANDOFF_MAX_ACTIONS, byref(n))
        return self._actions(acts, n.value)

    def is_complete(self) -> bool:
        """True once a COMPLETE action was issued."""
        v = c_int32()
        lib.kvbm_handoff_is_complete(self.handle, byref(v))
        return bool(v.value)

    def completion(self) -> Completion:
        """How the hand-off ended (Completion.NONE while not)."""
        v = c_int32()
        lib.kvbm_handoff_completion(self.handle, byref(v))
        return Completion(v.value)
