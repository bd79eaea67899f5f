"""What an attempt answers once it is done (``attempt_answer``), how a lease's liveness in
Redis reaches the core (``with_lease``), and the scope's lease name
(docs/design.md §5 steps 3 and 6)."""

from __future__ import annotations

import uuid

import msgspec
import pytest

from service.core import (
    Claim,
    ClaimKind,
    OperationConflict,
    Replay,
    Scope,
    Superseded,
    Unsettled,
    attempt_answer,
    decide_claim,
    with_lease,
)

from .factories import NOW, RECORD_LEASE, make_record, make_request


@pytest.mark.parametrize("state", ["completed", "failed"])
@pytest.mark.parametrize("stored_by_attempt", [True, False])
def test_a_terminal_row_is_answered_with_its_result(state: str, stored_by_attempt: bool) -> None:
    record = make_record(state=state)
    answer = attempt_answer(record, stored_by_attempt=stored_by_attempt)
    assert answer == Replay(
        result=record.result,
        state=record.state,
        operation_id=record.reservation.operation_id,
        replayed=not stored_by_attempt,
    )


def test_a_conflicted_row_is_answered_as_a_conflict_whoever_stored_it() -> None:
    record = make_record(state="conflict")
    for stored_by_attempt in (True, False):
        answer = attempt_answer(record, stored_by_attempt=stored_by_attempt)
        assert answer == OperationConflict(operation_id=record.reservation.operation_id)


@pytest.mark.parametrize(("state", "lease"), [("unknown", None), ("in_progress", "valid")])
def test_an_undecided_row_is_answered_as_unsettled(state: str, lease: str | None) -> None:
    record = make_record(state=state, lease=lease)
    answer = attempt_answer(record, stored_by_attempt=False)
    assert answer == Unsettled(
        operation_id=record.reservation.operation_id,
        state=record.state,
        lease_expires_at=record.lease_expires_at,
    )


def test_with_lease_sets_the_expiry_redis_reports_on_an_in_progress_row() -> None:
    record = make_record(state="in_progress", lease="expired")
    live = with_lease(record, 5.0, NOW)
    assert live.lease_expires_at == NOW + 5.0
    assert live.lease_valid(NOW)
    # everything else is the row as stored
    assert live.reservation == record.reservation and live.revision == record.revision


def test_with_lease_none_means_nobody_holds_it_and_the_row_is_stale() -> None:
    record = make_record(state="in_progress", lease="valid")
    stale = with_lease(record, None, NOW)
    assert stale.lease_expires_at is None
    assert not stale.lease_valid(NOW)
    # a stale in_progress row is demoted on the next claim, not answered as in progress
    decision = decide_claim(stale, make_request(), NOW)
    assert isinstance(decision, Claim) and decision.kind is ClaimKind.DEMOTE_STALE


@pytest.mark.parametrize("state", ["unknown", "completed", "failed", "conflict"])
def test_with_lease_leaves_rows_that_are_not_in_progress_alone(state: str) -> None:
    record = make_record(state=state, lease_expires_at=RECORD_LEASE)
    assert with_lease(record, None, NOW) is record
    assert with_lease(record, 30.0, NOW) is record


def test_the_lease_name_is_a_digest_unique_per_scope_part() -> None:
    principal = uuid.UUID(int=1)
    base = Scope(tenant="t", principal_id=principal, route="POST /x", idempotency_key="k")
    name = base.lease_name()
    assert len(name) == 64 and all(c in "0123456789abcdef" for c in name)
    same = Scope(tenant="t", principal_id=principal, route="POST /x", idempotency_key="k")
    assert same.lease_name() == name
    others = [
        Scope(tenant="u", principal_id=principal, route="POST /x", idempotency_key="k"),
        Scope(tenant="t", principal_id=uuid.UUID(int=2), route="POST /x", idempotency_key="k"),
        Scope(tenant="t", principal_id=principal, route="POST /y", idempotency_key="k"),
        Scope(tenant="t", principal_id=principal, route="POST /x", idempotency_key="k2"),
    ]
    assert len({other.lease_name() for other in others} | {name}) == len(others) + 1


@pytest.mark.parametrize("state", ["unknown", "in_progress", "completed", "conflict"])
def test_a_row_of_a_later_epoch_is_answered_as_superseded_whatever_it_holds(state: str) -> None:
    record = make_record(state=state)
    later = msgspec.structs.replace(
        record,
        reservation=msgspec.structs.replace(record.reservation, binding_generation=2),
    )
    answer = attempt_answer(later, stored_by_attempt=False, epoch=1)
    assert answer == Superseded(
        operation_id=record.reservation.operation_id,
        binding_generation=2,
        state=later.state,
    )
    # the attempt's own epoch is answered by the row as usual
    assert not isinstance(attempt_answer(later, stored_by_attempt=False, epoch=2), Superseded)
