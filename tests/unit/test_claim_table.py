"""What a client request does with the row of its scope (``decide_claim``, docs/design.md §5
steps 2 and 4).

First match wins: no row -> NEW claim; fingerprint differs -> FingerprintMismatch; binding
differs -> BindingMismatch; conflict -> OperationConflict; completed/failed -> Replay;
in_progress with a valid lease -> InProgress; in_progress whose lease is gone -> DEMOTE_STALE;
unknown -> FROM_UNKNOWN. A claim takes the next fencing token and bumps the revision.
"""

from __future__ import annotations

import pytest

from service.core import (
    Binding,
    BindingMismatch,
    Claim,
    ClaimKind,
    FingerprintMismatch,
    InProgress,
    Observation,
    ObservationKind,
    OperationConflict,
    OperationState,
    Record,
    Replay,
    ReservationTuple,
    Result,
    Source,
    decide_claim,
)

from .factories import (
    FENCING_TOKEN,
    NOW,
    RECORD_LEASE,
    REQUEST_LEASE,
    REVISION,
    LeaseSpec,
    make_binding,
    make_record,
    make_request,
    make_result,
    replace,
)

OTHER_FINGERPRINT = "fp-other"
OTHER_PRINCIPAL = make_binding(principal_id="principal-2")
ROTATED_CREDENTIAL = make_binding(credential_generation=2)


def test_no_row_claims_a_new_operation() -> None:
    request = make_request(new_operation_id="op-new", lease_expires_at=REQUEST_LEASE)
    decision = decide_claim(None, request, NOW)
    assert decision == Claim(
        kind=ClaimKind.NEW,
        record=Record(
            reservation=ReservationTuple(
                operation_id="op-new",
                request_fingerprint=request.request_fingerprint,
                binding_generation=1,
            ),
            binding=request.binding,
            state=OperationState.IN_PROGRESS,
            revision=1,
            fencing_token=1,
            lease_expires_at=REQUEST_LEASE,
            result=None,
            conflict=None,
        ),
        expected_revision=None,
        demotion=None,
    )


def test_new_claim_holds_a_valid_lease_at_the_time_of_claiming() -> None:
    decision = decide_claim(None, make_request(), NOW)
    assert isinstance(decision, Claim)
    assert decision.record.lease_valid(NOW)


@pytest.mark.parametrize("state", list(OperationState), ids=[s.value for s in OperationState])
def test_reused_key_with_another_request_is_a_fingerprint_mismatch(state: OperationState) -> None:
    record = make_record(state)
    decision = decide_claim(record, make_request(request_fingerprint=OTHER_FINGERPRINT), NOW)
    assert decision == FingerprintMismatch(operation_id=record.reservation.operation_id)


@pytest.mark.parametrize(
    "binding",
    [OTHER_PRINCIPAL, ROTATED_CREDENTIAL],
    ids=["other_principal", "other_credential_generation"],
)
@pytest.mark.parametrize("state", list(OperationState), ids=[s.value for s in OperationState])
def test_request_under_another_binding_is_a_binding_mismatch(
    state: OperationState, binding: Binding
) -> None:
    record = make_record(state)
    decision = decide_claim(record, make_request(binding=binding), NOW)
    assert decision == BindingMismatch(operation_id=record.reservation.operation_id)


def test_conflict_row_reports_operation_conflict() -> None:
    record = make_record("conflict")
    assert decide_claim(record, make_request(), NOW) == OperationConflict(
        operation_id=record.reservation.operation_id
    )


@pytest.mark.parametrize(
    ("state", "result"),
    [
        (OperationState.COMPLETED, make_result("d1", 201)),
        (OperationState.FAILED, make_result("d1", 402)),
    ],
    ids=["completed", "failed"],
)
def test_terminal_row_replays_its_stored_result(state: OperationState, result: Result) -> None:
    record = make_record(state, result=result)
    assert decide_claim(record, make_request(), NOW) == Replay(
        result=result, state=state, operation_id=record.reservation.operation_id
    )


def test_terminal_row_replays_even_with_a_stale_lease_left_on_it() -> None:
    record = make_record("completed", lease="valid")
    decision = decide_claim(record, make_request(), NOW)
    assert isinstance(decision, Replay)


def test_in_progress_with_a_valid_lease_is_in_progress() -> None:
    record = make_record("in_progress", lease="valid")
    assert decide_claim(record, make_request(), NOW) == InProgress(
        operation_id=record.reservation.operation_id, lease_expires_at=RECORD_LEASE
    )


@pytest.mark.parametrize(
    "lease", ["expired", None, NOW], ids=["expired_lease", "no_lease", "lease_ends_now"]
)
def test_stale_in_progress_is_demoted_then_claimed(lease: LeaseSpec) -> None:
    record = make_record("in_progress", lease=lease)
    decision = decide_claim(record, make_request(lease_expires_at=REQUEST_LEASE), NOW)
    assert decision == Claim(
        kind=ClaimKind.DEMOTE_STALE,
        record=replace(
            record,
            state=OperationState.IN_PROGRESS,
            revision=REVISION + 1,
            fencing_token=FENCING_TOKEN + 1,
            lease_expires_at=REQUEST_LEASE,
        ),
        expected_revision=REVISION,
        demotion=Observation(
            reservation=record.reservation, kind=ObservationKind.UNKNOWN, source=Source.CLAIM
        ),
    )


def test_demotion_observation_reports_unknown_from_the_claim_on_the_rows_tuple() -> None:
    record = make_record("in_progress", lease="expired")
    decision = decide_claim(record, make_request(), NOW)
    assert isinstance(decision, Claim)
    demotion = decision.demotion
    assert demotion is not None
    assert demotion.kind is ObservationKind.UNKNOWN
    assert demotion.source is Source.CLAIM
    assert demotion.reservation == record.reservation
    assert demotion.fencing_token is None
    assert demotion.result is None
    assert demotion.lease_expires_at is None
    assert demotion.verified is True


def test_unknown_row_is_claimed_with_the_next_fencing_token() -> None:
    record = make_record("unknown")
    decision = decide_claim(record, make_request(lease_expires_at=REQUEST_LEASE), NOW)
    assert decision == Claim(
        kind=ClaimKind.FROM_UNKNOWN,
        record=replace(
            record,
            state=OperationState.IN_PROGRESS,
            revision=REVISION + 1,
            fencing_token=FENCING_TOKEN + 1,
            lease_expires_at=REQUEST_LEASE,
        ),
        expected_revision=REVISION,
        demotion=None,
    )


@pytest.mark.parametrize(
    "record",
    [make_record("unknown"), make_record("in_progress", lease="expired")],
    ids=["from_unknown", "demote_stale"],
)
def test_claim_keeps_the_reservation_and_the_binding(record: Record) -> None:
    decision = decide_claim(record, make_request(), NOW)
    assert isinstance(decision, Claim)
    claimed = decision.record
    assert claimed.reservation == record.reservation
    assert claimed.binding == record.binding
    assert claimed.lease_valid(NOW)


def test_claimed_row_is_in_progress_for_the_next_request() -> None:
    record = make_record("unknown")
    first = decide_claim(record, make_request(), NOW)
    assert isinstance(first, Claim)
    second = decide_claim(first.record, make_request(), NOW)
    assert second == InProgress(
        operation_id=record.reservation.operation_id, lease_expires_at=REQUEST_LEASE
    )


def test_claimed_row_is_claimable_again_once_its_lease_is_gone() -> None:
    first = decide_claim(make_record("unknown"), make_request(), NOW)
    assert isinstance(first, Claim)
    later = REQUEST_LEASE + 1.0
    second = decide_claim(first.record, make_request(lease_expires_at=later + 30.0), later)
    assert isinstance(second, Claim)
    assert second.kind is ClaimKind.DEMOTE_STALE
    assert second.record.fencing_token == FENCING_TOKEN + 2
    assert second.record.revision == REVISION + 2
    assert second.expected_revision == REVISION + 1


# Precedence: fingerprint mismatch, then binding mismatch, then conflict, then the rest.


@pytest.mark.parametrize("state", list(OperationState), ids=[s.value for s in OperationState])
def test_fingerprint_mismatch_is_checked_before_binding_mismatch(state: OperationState) -> None:
    record = make_record(state)
    request = make_request(request_fingerprint=OTHER_FINGERPRINT, binding=OTHER_PRINCIPAL)
    assert decide_claim(record, request, NOW) == FingerprintMismatch(
        operation_id=record.reservation.operation_id
    )


def test_binding_mismatch_is_checked_before_conflict() -> None:
    record = make_record("conflict")
    decision = decide_claim(record, make_request(binding=ROTATED_CREDENTIAL), NOW)
    assert decision == BindingMismatch(operation_id=record.reservation.operation_id)


def test_fingerprint_mismatch_is_checked_before_conflict() -> None:
    record = make_record("conflict")
    decision = decide_claim(record, make_request(request_fingerprint=OTHER_FINGERPRINT), NOW)
    assert decision == FingerprintMismatch(operation_id=record.reservation.operation_id)


def test_conflict_is_checked_before_replay_of_its_stored_result() -> None:
    record = make_record("conflict")
    assert record.result is not None
    assert isinstance(decide_claim(record, make_request(), NOW), OperationConflict)


def test_claim_decision_is_pure() -> None:
    record = make_record("unknown")
    request = make_request()
    assert decide_claim(record, request, NOW) == decide_claim(record, request, NOW)
    assert record == make_record("unknown")
