"""Drives the hand-off coordinator like an engine connector (mirrors examples/c/handoff.c)."""
import uuid

import pytest

from kvbmgo import (ActionKind, Completion, FactKind, HandoffCoordinator, HandoffOrder,
                    OutcomeKind)
from kvbmgo.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError


class Driver:
    def __init__(self, h: HandoffCoordinator, fail_reserve: bool):
        self.h, self.fail_reserve = h, fail_reserve
        self.seen, self.completion = [], None

    def fact(self, kind):
        self.run(self.h.on_fact(kind, full_prompt_tokens=128, kv_bytes_per_token=131072,
                                bandwidth_gbs=25.0, transferable_tokens=128))

    def run(self, actions):
        for a in actions:
            assert a.handoff_id == self.h.id
            self.seen.append(a.kind)
            if a.kind == ActionKind.SUBMIT_PREFILL:
                self.run(self.h.on_outcome(a.id, OutcomeKind.SUBMITTED))
                self.fact(FactKind.SOURCE_HELD)
            elif a.kind == ActionKind.RESERVE_DESTINATION:
                if self.fail_reserve:
                    self.run(self.h.on_outcome(a.id, OutcomeKind.FAILED,
                                               "destination has no free blocks"))
                else:
                    self.run(self.h.on_outcome(a.id, OutcomeKind.ACCEPTED))
                    self.fact(FactKind.DESTINATION_RESERVED)
            elif a.kind == ActionKind.START_TRANSFER:
                assert a.delay_ms > 0
                self.run(self.h.on_outcome(a.id, OutcomeKind.SCHEDULED))
                self.fact(FactKind.TRANSFER_COMPLETED)
            elif a.kind == ActionKind.COMPLETE:
                self.completion = a.completion
            else:
                self.run(self.h.on_outcome(a.id, OutcomeKind.APPLIED))


@pytest.mark.parametrize("order", [HandoffOrder.SOURCE_FIRST, HandoffOrder.DESTINATION_FIRST])
@pytest.mark.parametrize("fail_reserve,want", [(False, Completion.SUCCESS),
                                               (True, Completion.CANCELED)])
def test_handoff(order, fail_reserve, want):
    with HandoffCoordinator(uuid.uuid4(), order, fallback_delay_ms=1.5) as h:
        assert not h.is_complete()
        d = Driver(h, fail_reserve)
        first = h.start()
        assert [a.kind for a in first] == [ActionKind.SUBMIT_PREFILL
                                           if order == HandoffOrder.SOURCE_FIRST
                                           else ActionKind.RESERVE_DESTINATION]
        d.run(first)
        assert h.is_complete()
        assert h.completion() == want == d.completion
        if not fail_reserve:
            assert ActionKind.ACTIVATE_DESTINATION in d.seen
        assert h.start() == []  # once complete, every call returns nothing


def test_canceled_at_once_cleans_up():
    hid = bytes([9] + [0] * 15)
    with HandoffCoordinator(hid, HandoffOrder.SOURCE_FIRST) as h:
        h.start()
        d = Driver(h, False)
        d.run(h.on_fact(FactKind.CANCELED))
        assert h.completion() == Completion.CANCELED
        assert ActionKind.CANCEL_SOURCE in d.seen or d.completion == Completion.CANCELED


def test_handoff_errors():
    with HandoffCoordinator(uuid.uuid4(), HandoffOrder.SOURCE_FIRST) as h:
        (a,) = h.start()
        with pytest.raises(NotFoundError) as e:
            h.on_outcome(a.id + 1000, OutcomeKind.SUBMITTED)
        assert e.value.message and e.value.status == -3
        with pytest.raises(InvalidArgumentError):
            h.on_outcome(a.id, OutcomeKind.SCHEDULED)  # an outcome SubmitPrefill does not take
        with pytest.raises(FailedPreconditionError):
            h.on_fact(FactKind.TRANSFER_COMPLETED)  # out of order
        assert h.completion() == Completion.NONE
    with pytest.raises(ValueError, match="16 bytes"):
        HandoffCoordinator(b"short", HandoffOrder.SOURCE_FIRST)
    with pytest.raises(InvalidArgumentError, match="kvbm_handoff_new"):
        HandoffCoordinator(uuid.uuid4(), 7)
