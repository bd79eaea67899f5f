"""An operator's resolution through the merge (rules in ``service/core/settle.py``,
"Resolution"): it settles an ``unknown`` row (or one whose lease is gone) or a ``conflict``
row, never a live attempt's, and never overwrites a ``completed`` or ``failed`` one; a row
resolved from a conflict ignores the conflict's other digests afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest

from service.core import (
    Apply,
    Disposition,
    Ignore,
    InvalidObservation,
    Observation,
    ObservationKind,
    OperationState,
    Quarantine,
    Reason,
    Source,
    Stage,
    Strengthen,
    settle,
)

from .factories import (
    NEW_DIGEST,
    NOW,
    REVISION,
    SEEN_DIGEST,
    STORED_DIGEST,
    make_conflict,
    make_observation,
    make_record,
    make_result,
)

COMPLETED = OperationState.COMPLETED
FAILED = OperationState.FAILED


def resolution(kind: str = "completed", digest: str = NEW_DIGEST, **overrides: Any) -> Observation:
    fields: dict[str, Any] = {"source": Source.ADMIN, "resolution": True, **overrides}
    return make_observation(kind, digest=digest, **fields)


def conflict_row(kinds: tuple[str, ...] = ("completed", "failed")) -> Any:
    return make_record(
        "conflict",
        result=make_result(STORED_DIGEST),
        conflict=make_conflict((STORED_DIGEST, SEEN_DIGEST), kinds),
    )


@pytest.mark.parametrize("kind", ["completed", "failed"])
@pytest.mark.parametrize(
    "row",
    [make_record("unknown"), make_record("in_progress", lease="expired")],
    ids=["unknown", "expired"],
)
def test_resolution_settles_an_unknown_row_or_one_whose_lease_is_gone(kind: str, row: Any) -> None:
    observation = resolution(kind)
    decision = settle(row, observation, NOW)
    assert isinstance(decision, Apply)
    assert decision.reason is Reason.TERMINAL_APPLIED
    assert decision.record.state is OperationState(kind)
    assert decision.record.result == observation.result
    assert decision.record.lease_expires_at is None
    assert decision.record.revision == REVISION + 1


def test_resolution_leaves_a_live_attempt_to_settle_its_own_row() -> None:
    decision = settle(make_record("in_progress", lease="valid"), resolution(), NOW)
    assert decision == Ignore(stage=Stage.RANK_MERGE, reason=Reason.ATTEMPT_LIVE)


@pytest.mark.parametrize("state", [COMPLETED, FAILED])
def test_resolution_never_overwrites_a_terminal_row(state: OperationState) -> None:
    status = 201 if state is COMPLETED else 402
    row = make_record(state, result=make_result(STORED_DIGEST, status))
    for kind in ("completed", "failed"):
        for digest in (STORED_DIGEST, NEW_DIGEST):
            decision = settle(row, resolution(kind, digest), NOW)
            if kind == state.value and digest == STORED_DIGEST:
                assert decision == Strengthen(stage=Stage.TERMINAL, reason=Reason.SAME_DIGEST)
            else:
                assert decision == Ignore(stage=Stage.TERMINAL, reason=Reason.TERMINAL_KEPT)


@pytest.mark.parametrize("kind", ["completed", "failed"])
def test_resolution_of_a_conflict_applies_one_of_its_outcomes_and_keeps_its_digests(
    kind: str,
) -> None:
    row = conflict_row()
    observation = resolution(kind)
    decision = settle(row, observation, NOW)
    assert isinstance(decision, Apply)
    assert decision.reason is Reason.CONFLICT_RESOLVED
    assert decision.disposition is Disposition.APPLIED
    assert decision.record.state is OperationState(kind)
    assert decision.record.result == observation.result
    assert decision.record.conflict == row.conflict


def test_resolution_of_a_conflict_refuses_an_outcome_nobody_observed() -> None:
    decision = settle(conflict_row(("completed", "completed")), resolution("failed"), NOW)
    assert decision == Ignore(stage=Stage.TERMINAL, reason=Reason.NOT_A_CONFLICTING_KIND)


def test_a_resolved_row_ignores_the_conflicts_other_digests_and_conflicts_on_new_ones() -> None:
    resolved = settle(conflict_row(), resolution("completed", STORED_DIGEST), NOW)
    assert isinstance(resolved, Apply)
    row = resolved.record
    replayed = make_observation("failed", digest=SEEN_DIGEST, source=Source.FEED)
    assert settle(row, replayed, NOW) == Ignore(
        stage=Stage.TERMINAL, reason=Reason.ALREADY_RESOLVED
    )
    same = make_observation("completed", digest=STORED_DIGEST, source=Source.FEED)
    assert isinstance(settle(row, same, NOW), Strengthen)
    new = settle(row, make_observation("completed", digest=NEW_DIGEST), NOW)
    assert isinstance(new, Apply)
    assert new.record.state is OperationState.CONFLICT


def test_resolution_passes_the_tuple_gate_first() -> None:
    decision = settle(make_record("unknown"), resolution(tuple_match=False), NOW)
    assert isinstance(decision, Quarantine)


@pytest.mark.parametrize(
    "overrides",
    [
        {"source": Source.EVIDENCE},
        {"kind": ObservationKind.UNKNOWN, "result": None},
    ],
    ids=["not-an-admin", "not-terminal"],
)
def test_a_resolution_is_an_admins_terminal_observation(overrides: dict[str, Any]) -> None:
    with pytest.raises(InvalidObservation):
        resolution(**overrides)
