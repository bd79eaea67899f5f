"""decide_supersede: every branch, and what the new epoch looks like."""

from __future__ import annotations

import pytest

from service.core import (
    Binding,
    OperationState,
    Refuse,
    RefuseReason,
    Supersede,
    SupersedeRequest,
    decide_supersede,
)

from .factories import NOW, make_record, make_result


@pytest.mark.parametrize(
    ("state", "lease", "force", "expected"),
    [
        ("completed", None, False, RefuseReason.COMPLETED_NEEDS_FORCE),
        ("conflict", None, False, RefuseReason.CONFLICT_NEEDS_FORCE),
        ("in_progress", "valid", False, RefuseReason.LIVE_ATTEMPT),
    ],
)
def test_supersede_is_refused_without_force(
    state: str, lease: str | None, force: bool, expected: RefuseReason
) -> None:
    kwargs = {"result": make_result()} if state in ("completed", "conflict") else {}
    record = make_record(state=state, lease=lease, **kwargs)
    assert decide_supersede(record, SupersedeRequest(force=force), NOW) == Refuse(reason=expected)
    # and an external effect's conflict too: a payout in conflict has paid at least once
    external = SupersedeRequest(force=force, external=True)
    if state == "conflict":
        assert decide_supersede(record, external, NOW) == Refuse(reason=expected)


@pytest.mark.parametrize(
    ("state", "lease", "force"),
    [
        ("unknown", None, False),
        ("in_progress", "expired", False),
        ("failed", None, False),
        ("conflict", None, True),
        ("completed", None, True),
        ("in_progress", "valid", True),
    ],
)
def test_supersede_starts_a_new_epoch(state: str, lease: str | None, force: bool) -> None:
    kwargs = {}
    if state in ("completed", "failed", "conflict"):
        kwargs["result"] = make_result()
    record = make_record(state=state, lease=lease, **kwargs)
    if state == "conflict":
        from service.core import ConflictInfo, ObservationKind

        record = make_record(
            state=state,
            result=make_result(),
            conflict=ConflictInfo(
                digests=("d1", "d2"),
                kinds=(ObservationKind.COMPLETED, ObservationKind.COMPLETED),
            ),
        )
    decision = decide_supersede(record, SupersedeRequest(force=force), NOW)

    assert isinstance(decision, Supersede)
    new = decision.record
    assert new.reservation.binding_generation == record.reservation.binding_generation + 1
    assert new.reservation.operation_id == record.reservation.operation_id
    assert new.reservation.request_fingerprint == record.reservation.request_fingerprint
    assert new.binding == record.binding
    assert new.state is OperationState.UNKNOWN
    assert new.fencing_token == record.fencing_token + 1
    assert new.revision == record.revision + 1
    assert decision.expected_revision == record.revision
    assert (new.result, new.conflict, new.lease_expires_at) == (None, None, None)
    assert decision.archived.reservation == record.reservation
    assert decision.archived.final_state is record.state
    expected_digest = record.result.digest if record.result else None
    assert decision.archived.result_digest == expected_digest
    assert decision.reran_completed is (state == "completed")
    assert decision.fenced_live_attempt is (state == "in_progress" and lease == "valid")
    # a local effect may run again in the new epoch if it had completed (or was in conflict)
    assert decision.effect_may_run_again is (state in ("completed", "conflict"))


def test_supersede_with_an_edited_request_and_a_rebind() -> None:
    record = make_record(state="unknown")
    rebound = Binding(principal_id=record.binding.principal_id, credential_generation=7)
    decision = decide_supersede(
        record, SupersedeRequest(request_fingerprint="e" * 64, binding=rebound), NOW
    )
    assert isinstance(decision, Supersede)
    assert decision.record.reservation.request_fingerprint == "e" * 64
    assert decision.record.binding == rebound
    assert decision.archived.binding == record.binding


@pytest.mark.parametrize("state", ["unknown", "in_progress"])
def test_external_effect_with_unknown_outcome_needs_force(state: str) -> None:
    record = make_record(state=state, lease="expired" if state == "in_progress" else None)
    refused = decide_supersede(record, SupersedeRequest(external=True), NOW)
    assert refused == Refuse(reason=RefuseReason.OUTCOME_UNKNOWN_NEEDS_FORCE)
    forced = decide_supersede(record, SupersedeRequest(external=True, force=True), NOW)
    assert isinstance(forced, Supersede)
    assert forced.effect_may_run_again


def test_external_effect_that_failed_needs_no_force() -> None:
    record = make_record(state="failed")
    decision = decide_supersede(record, SupersedeRequest(external=True), NOW)
    assert isinstance(decision, Supersede)
    assert not decision.effect_may_run_again


def test_external_effect_in_conflict_needs_force_and_may_pay_again() -> None:
    record = make_record(state="conflict")
    refused = decide_supersede(record, SupersedeRequest(external=True), NOW)
    assert refused == Refuse(reason=RefuseReason.CONFLICT_NEEDS_FORCE)
    forced = decide_supersede(record, SupersedeRequest(external=True, force=True), NOW)
    assert isinstance(forced, Supersede)
    assert forced.effect_may_run_again
