"""The settlement merge as a transition table (docs/design.md §4, rules in
``service/core/settle.py``).

Every expected value below follows from these rules:

* Stage A: unverified evidence or another tuple -> Quarantine; a fencing token that is not
  the row's current one -> Ignore (stage A), before any merge.
* Stage B (both non-terminal): rank(unknown) = 0 < rank(in_progress, valid lease) = 1; an
  expired in_progress ranks 0; the holder (current fencing token) reporting ``unknown`` ends
  its own lease first. Higher rank -> Apply in_progress with the observed lease; rank 1 and
  the holder reports a later lease -> Apply the extension; rank 0 and the row still says
  in_progress -> Apply unknown without a lease; otherwise Ignore.
* Stage C: non-terminal after terminal -> Ignore; terminal on a non-terminal row -> Apply it;
  same kind and digest -> Strengthen; same kind, other digest -> conflict; completed vs
  failed -> conflict (or completed wins under COMPLETED_WINS); a conflict row strengthens a
  digest already seen and appends a new one.

The table rows fix the record at ``REVISION``/``FENCING_TOKEN`` and the clock at ``NOW``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from service.core import (
    Apply,
    ConflictInfo,
    Decision,
    Disposition,
    Ignore,
    InvalidObservation,
    Observation,
    ObservationKind,
    OperationState,
    Quarantine,
    Reason,
    Record,
    Result,
    Source,
    Stage,
    Strengthen,
    TerminalPolicy,
    settle,
)
from service.problem_types import problem_type

from .factories import (
    EXPIRED_LEASE,
    FAILURE_STATUS,
    FENCING_TOKEN,
    NEW_DIGEST,
    NOW,
    OBSERVED_LEASE,
    RECORD_LEASE,
    SEEN_DIGEST,
    STALE_FENCING_TOKEN,
    STORED_DIGEST,
    SUCCESS_STATUS,
    apply_decision,
    make_conflict,
    make_observation,
    make_record,
    make_result,
    make_tuple,
    replace,
)

IN_PROGRESS = OperationState.IN_PROGRESS
UNKNOWN = OperationState.UNKNOWN
COMPLETED = OperationState.COMPLETED
FAILED = OperationState.FAILED
CONFLICT = OperationState.CONFLICT

GATE = Stage.TUPLE_GATE
RANK = Stage.RANK_MERGE
TERMINAL = Stage.TERMINAL

C = ObservationKind.COMPLETED
F = ObservationKind.FAILED

# What a terminal observation carries, and what a terminal row stores.
SAME_OK = make_result(STORED_DIGEST, SUCCESS_STATUS)
NEW_OK = make_result(NEW_DIGEST, SUCCESS_STATUS)
SAME_FAIL = make_result(STORED_DIGEST, FAILURE_STATUS)
NEW_FAIL = make_result(NEW_DIGEST, FAILURE_STATUS)

RECORDS: dict[str, Record] = {
    "in_progress_valid": make_record("in_progress", lease="valid"),
    "in_progress_expired": make_record("in_progress", lease="expired"),
    "unknown": make_record("unknown"),
    "completed": make_record("completed"),  # stores SAME_OK
    "failed": make_record("failed"),  # stores SAME_FAIL
    "conflict": make_record("conflict"),  # stores SAME_OK; saw d1, d2 (both completed)
}

# "same" is the row's stored digest (for a conflict row: a digest it has already seen);
# "different" is a digest no row has seen.
OBSERVATIONS: dict[str, Callable[..., Observation]] = {
    "in_progress_valid": lambda **kw: make_observation("in_progress", lease="valid", **kw),
    "in_progress_expired": lambda **kw: make_observation("in_progress", lease="expired", **kw),
    "unknown": lambda **kw: make_observation("unknown", **kw),
    "completed_same": lambda **kw: make_observation("completed", digest=STORED_DIGEST, **kw),
    "completed_different": lambda **kw: make_observation("completed", digest=NEW_DIGEST, **kw),
    "failed_same": lambda **kw: make_observation("failed", digest=STORED_DIGEST, **kw),
    "failed_different": lambda **kw: make_observation("failed", digest=NEW_DIGEST, **kw),
}

FENCING: dict[str, int | None] = {
    "none": None,
    "holder": FENCING_TOKEN,
    "stale": STALE_FENCING_TOKEN,
}


@dataclass(frozen=True)
class Expect:
    """The decision expected; for Apply also the row it writes (lease, result, conflict)."""

    decision: type[Decision]
    stage: Stage
    reason: Reason
    disposition: Disposition
    state: OperationState | None = None
    lease: float | None = None
    result: Result | None = None
    conflict: ConflictInfo | None = None


def ignored(stage: Stage, reason: Reason) -> Expect:
    return Expect(Ignore, stage, reason, Disposition.IGNORED)


def quarantined(reason: Reason) -> Expect:
    return Expect(Quarantine, GATE, reason, Disposition.QUARANTINED)


STRENGTHENED = Expect(Strengthen, TERMINAL, Reason.SAME_DIGEST, Disposition.STRENGTHENED)
LOWER = ignored(RANK, Reason.LOWER_OR_EQUAL_RANK)
AFTER_TERMINAL = ignored(TERMINAL, Reason.AFTER_TERMINAL)
STALE = ignored(GATE, Reason.STALE_FENCING_TOKEN)


def applied(
    stage: Stage,
    reason: Reason,
    *,
    state: OperationState,
    lease: float | None,
    result: Result | None,
    conflict: ConflictInfo | None,
) -> Expect:
    disposition = Disposition.CONFLICT if state is CONFLICT else Disposition.APPLIED
    return Expect(Apply, stage, reason, disposition, state, lease, result, conflict)


def terminal_applied(state: OperationState, result: Result) -> Expect:
    return applied(
        TERMINAL, Reason.TERMINAL_APPLIED, state=state, lease=None, result=result, conflict=None
    )


def conflict(
    reason: Reason,
    stored: Result,
    digests: tuple[str, ...],
    kinds: tuple[ObservationKind, ...],
) -> Expect:
    """The row turns (or stays) ``conflict``; the first stored result is never overwritten."""
    info = make_conflict(digests, kinds)
    return applied(TERMINAL, reason, state=CONFLICT, lease=None, result=stored, conflict=info)


D1, D2, D3 = STORED_DIGEST, SEEN_DIGEST, NEW_DIGEST

RAISED = applied(
    RANK, Reason.RANK_RAISED, state=IN_PROGRESS, lease=OBSERVED_LEASE, result=None, conflict=None
)
EXTENDED = applied(
    RANK, Reason.LEASE_EXTENDED, state=IN_PROGRESS, lease=OBSERVED_LEASE, result=None, conflict=None
)
LEASE_ENDED = applied(
    RANK, Reason.LEASE_ENDED, state=UNKNOWN, lease=None, result=None, conflict=None
)
TO_COMPLETED_SAME = terminal_applied(COMPLETED, SAME_OK)
TO_COMPLETED_NEW = terminal_applied(COMPLETED, NEW_OK)
TO_FAILED_SAME = terminal_applied(FAILED, SAME_FAIL)
TO_FAILED_NEW = terminal_applied(FAILED, NEW_FAIL)

COMPLETED_THEN_NEW_SUCCESS = conflict(Reason.DIFFERENT_DIGEST, SAME_OK, (D1, D3), (C, C))
COMPLETED_THEN_SAME_FAILURE = conflict(Reason.COMPLETED_VS_FAILED, SAME_OK, (D1, D1), (C, F))
COMPLETED_THEN_NEW_FAILURE = conflict(Reason.COMPLETED_VS_FAILED, SAME_OK, (D1, D3), (C, F))
FAILED_THEN_SAME_SUCCESS = conflict(Reason.COMPLETED_VS_FAILED, SAME_FAIL, (D1, D1), (F, C))
FAILED_THEN_NEW_SUCCESS = conflict(Reason.COMPLETED_VS_FAILED, SAME_FAIL, (D1, D3), (F, C))
FAILED_THEN_NEW_FAILURE = conflict(Reason.DIFFERENT_DIGEST, SAME_FAIL, (D1, D3), (F, F))
CONFLICT_GROWS_BY_SUCCESS = conflict(Reason.DIFFERENT_DIGEST, SAME_OK, (D1, D2, D3), (C, C, C))
CONFLICT_GROWS_BY_FAILURE = conflict(Reason.DIFFERENT_DIGEST, SAME_OK, (D1, D2, D3), (C, C, F))

FAILURE_AFTER_SUCCESS_IGNORED = ignored(TERMINAL, Reason.FAILED_AFTER_COMPLETED)
SUCCESS_REPLACES_SAME_FAILURE = applied(
    TERMINAL, Reason.COMPLETED_WINS, state=COMPLETED, lease=None, result=SAME_OK, conflict=None
)
SUCCESS_REPLACES_NEW_FAILURE = applied(
    TERMINAL, Reason.COMPLETED_WINS, state=COMPLETED, lease=None, result=NEW_OK, conflict=None
)


@dataclass(frozen=True)
class Row:
    record: str
    observation: str
    fencing: str
    expect: Expect

    @property
    def id(self) -> str:
        return f"{self.record}--{self.observation}--fencing_{self.fencing}"


TABLE: list[Row] = [
    # row in_progress, lease valid (rank 1)
    Row("in_progress_valid", "in_progress_valid", "none", LOWER),  # equal rank, not the holder
    Row("in_progress_valid", "in_progress_valid", "holder", EXTENDED),
    Row("in_progress_valid", "in_progress_expired", "none", LOWER),
    Row("in_progress_valid", "in_progress_expired", "holder", LOWER),
    Row("in_progress_valid", "unknown", "none", LOWER),  # a live worker is not demoted
    Row("in_progress_valid", "unknown", "holder", LEASE_ENDED),  # the holder ends its own lease
    Row("in_progress_valid", "completed_same", "none", TO_COMPLETED_SAME),
    Row("in_progress_valid", "completed_same", "holder", TO_COMPLETED_SAME),
    Row("in_progress_valid", "completed_different", "none", TO_COMPLETED_NEW),
    Row("in_progress_valid", "completed_different", "holder", TO_COMPLETED_NEW),
    Row("in_progress_valid", "failed_same", "none", TO_FAILED_SAME),
    Row("in_progress_valid", "failed_same", "holder", TO_FAILED_SAME),
    Row("in_progress_valid", "failed_different", "none", TO_FAILED_NEW),
    Row("in_progress_valid", "failed_different", "holder", TO_FAILED_NEW),
    # row in_progress, lease expired (ranks as unknown: 0)
    Row("in_progress_expired", "in_progress_valid", "none", RAISED),
    Row("in_progress_expired", "in_progress_valid", "holder", RAISED),
    Row("in_progress_expired", "in_progress_expired", "none", LEASE_ENDED),
    Row("in_progress_expired", "in_progress_expired", "holder", LEASE_ENDED),
    Row("in_progress_expired", "unknown", "none", LEASE_ENDED),
    Row("in_progress_expired", "unknown", "holder", LEASE_ENDED),
    Row("in_progress_expired", "completed_same", "none", TO_COMPLETED_SAME),
    Row("in_progress_expired", "completed_same", "holder", TO_COMPLETED_SAME),
    Row("in_progress_expired", "completed_different", "none", TO_COMPLETED_NEW),
    Row("in_progress_expired", "completed_different", "holder", TO_COMPLETED_NEW),
    Row("in_progress_expired", "failed_same", "none", TO_FAILED_SAME),
    Row("in_progress_expired", "failed_same", "holder", TO_FAILED_SAME),
    Row("in_progress_expired", "failed_different", "none", TO_FAILED_NEW),
    Row("in_progress_expired", "failed_different", "holder", TO_FAILED_NEW),
    # row unknown (rank 0)
    Row("unknown", "in_progress_valid", "none", RAISED),
    Row("unknown", "in_progress_valid", "holder", RAISED),
    Row("unknown", "in_progress_expired", "none", LOWER),  # a dead worker is not resurrected
    Row("unknown", "in_progress_expired", "holder", LOWER),
    Row("unknown", "unknown", "none", LOWER),
    Row("unknown", "unknown", "holder", LOWER),
    Row("unknown", "completed_same", "none", TO_COMPLETED_SAME),
    Row("unknown", "completed_same", "holder", TO_COMPLETED_SAME),
    Row("unknown", "completed_different", "none", TO_COMPLETED_NEW),
    Row("unknown", "completed_different", "holder", TO_COMPLETED_NEW),
    Row("unknown", "failed_same", "none", TO_FAILED_SAME),
    Row("unknown", "failed_same", "holder", TO_FAILED_SAME),
    Row("unknown", "failed_different", "none", TO_FAILED_NEW),
    Row("unknown", "failed_different", "holder", TO_FAILED_NEW),
    # row completed (stores d1)
    Row("completed", "in_progress_valid", "none", AFTER_TERMINAL),
    Row("completed", "in_progress_valid", "holder", AFTER_TERMINAL),
    Row("completed", "in_progress_expired", "none", AFTER_TERMINAL),
    Row("completed", "in_progress_expired", "holder", AFTER_TERMINAL),
    Row("completed", "unknown", "none", AFTER_TERMINAL),
    Row("completed", "unknown", "holder", AFTER_TERMINAL),
    Row("completed", "completed_same", "none", STRENGTHENED),
    Row("completed", "completed_same", "holder", STRENGTHENED),
    Row("completed", "completed_different", "none", COMPLETED_THEN_NEW_SUCCESS),
    Row("completed", "completed_different", "holder", COMPLETED_THEN_NEW_SUCCESS),
    Row("completed", "failed_same", "none", COMPLETED_THEN_SAME_FAILURE),
    Row("completed", "failed_same", "holder", COMPLETED_THEN_SAME_FAILURE),
    Row("completed", "failed_different", "none", COMPLETED_THEN_NEW_FAILURE),
    Row("completed", "failed_different", "holder", COMPLETED_THEN_NEW_FAILURE),
    # row failed (stores d1)
    Row("failed", "in_progress_valid", "none", AFTER_TERMINAL),
    Row("failed", "in_progress_valid", "holder", AFTER_TERMINAL),
    Row("failed", "in_progress_expired", "none", AFTER_TERMINAL),
    Row("failed", "in_progress_expired", "holder", AFTER_TERMINAL),
    Row("failed", "unknown", "none", AFTER_TERMINAL),
    Row("failed", "unknown", "holder", AFTER_TERMINAL),
    Row("failed", "completed_same", "none", FAILED_THEN_SAME_SUCCESS),
    Row("failed", "completed_same", "holder", FAILED_THEN_SAME_SUCCESS),
    Row("failed", "completed_different", "none", FAILED_THEN_NEW_SUCCESS),
    Row("failed", "completed_different", "holder", FAILED_THEN_NEW_SUCCESS),
    Row("failed", "failed_same", "none", STRENGTHENED),
    Row("failed", "failed_same", "holder", STRENGTHENED),
    Row("failed", "failed_different", "none", FAILED_THEN_NEW_FAILURE),
    Row("failed", "failed_different", "holder", FAILED_THEN_NEW_FAILURE),
    # row conflict (saw d1 and d2, both completed; stores d1)
    Row("conflict", "in_progress_valid", "none", AFTER_TERMINAL),
    Row("conflict", "in_progress_valid", "holder", AFTER_TERMINAL),
    Row("conflict", "in_progress_expired", "none", AFTER_TERMINAL),
    Row("conflict", "in_progress_expired", "holder", AFTER_TERMINAL),
    Row("conflict", "unknown", "none", AFTER_TERMINAL),
    Row("conflict", "unknown", "holder", AFTER_TERMINAL),
    Row("conflict", "completed_same", "none", STRENGTHENED),
    Row("conflict", "completed_same", "holder", STRENGTHENED),
    Row("conflict", "completed_different", "none", CONFLICT_GROWS_BY_SUCCESS),
    Row("conflict", "completed_different", "holder", CONFLICT_GROWS_BY_SUCCESS),
    Row("conflict", "failed_same", "none", STRENGTHENED),  # a digest already seen
    Row("conflict", "failed_same", "holder", STRENGTHENED),
    Row("conflict", "failed_different", "none", CONFLICT_GROWS_BY_FAILURE),
    Row("conflict", "failed_different", "holder", CONFLICT_GROWS_BY_FAILURE),
]

# Under COMPLETED_WINS only completed-vs-failed changes; every other row stays as in TABLE.
COMPLETED_WINS_TABLE: list[Row] = [
    Row("completed", "failed_same", "none", FAILURE_AFTER_SUCCESS_IGNORED),
    Row("completed", "failed_same", "holder", FAILURE_AFTER_SUCCESS_IGNORED),
    Row("completed", "failed_different", "none", FAILURE_AFTER_SUCCESS_IGNORED),
    Row("completed", "failed_different", "holder", FAILURE_AFTER_SUCCESS_IGNORED),
    Row("failed", "completed_same", "none", SUCCESS_REPLACES_SAME_FAILURE),
    Row("failed", "completed_same", "holder", SUCCESS_REPLACES_SAME_FAILURE),
    Row("failed", "completed_different", "none", SUCCESS_REPLACES_NEW_FAILURE),
    Row("failed", "completed_different", "holder", SUCCESS_REPLACES_NEW_FAILURE),
]

_POLICY_SENSITIVE = {(row.record, row.observation, row.fencing) for row in COMPLETED_WINS_TABLE}
POLICY_INSENSITIVE_TABLE = [
    row for row in TABLE if (row.record, row.observation, row.fencing) not in _POLICY_SENSITIVE
]
APPLY_ROWS = [row for row in TABLE if row.expect.decision is Apply]


def observe(row: Row) -> Observation:
    return OBSERVATIONS[row.observation](fencing_token=FENCING[row.fencing])


def assert_decision(record: Record, decision: Decision, expect: Expect) -> None:
    assert type(decision) is expect.decision
    assert decision.stage is expect.stage
    assert decision.reason is expect.reason
    assert decision.disposition is expect.disposition
    if isinstance(decision, Apply):
        assert expect.state is not None
        assert decision.expected_revision == record.revision
        assert decision.record == replace(
            record,
            revision=record.revision + 1,
            state=expect.state,
            lease_expires_at=expect.lease,
            result=expect.result,
            conflict=expect.conflict,
        )


def _ids(rows: list[Row]) -> list[str]:
    return [row.id for row in rows]


def test_table_covers_every_state_kind_and_fencing_combination() -> None:
    keys = [(row.record, row.observation, row.fencing) for row in TABLE]
    assert len(keys) == len(set(keys))
    assert set(keys) == set(itertools.product(RECORDS, OBSERVATIONS, ("none", "holder")))


@pytest.mark.parametrize("row", TABLE, ids=_ids(TABLE))
def test_settle_decides_each_matching_observation_per_the_merge_rules(row: Row) -> None:
    record = RECORDS[row.record]
    assert_decision(record, settle(record, observe(row), NOW), row.expect)


@pytest.mark.parametrize("row", TABLE, ids=_ids(TABLE))
def test_conflict_policy_is_the_default(row: Row) -> None:
    record = RECORDS[row.record]
    observation = observe(row)
    assert settle(record, observation, NOW) == settle(
        record, observation, NOW, policy=TerminalPolicy.CONFLICT
    )


@pytest.mark.parametrize("row", COMPLETED_WINS_TABLE, ids=_ids(COMPLETED_WINS_TABLE))
def test_completed_wins_policy_resolves_completed_vs_failed(row: Row) -> None:
    record = RECORDS[row.record]
    decision = settle(record, observe(row), NOW, policy=TerminalPolicy.COMPLETED_WINS)
    assert_decision(record, decision, row.expect)


@pytest.mark.parametrize("row", POLICY_INSENSITIVE_TABLE, ids=_ids(POLICY_INSENSITIVE_TABLE))
def test_completed_wins_policy_changes_nothing_else(row: Row) -> None:
    record = RECORDS[row.record]
    decision = settle(record, observe(row), NOW, policy=TerminalPolicy.COMPLETED_WINS)
    assert_decision(record, decision, row.expect)


# Stage A decides before any merge: one expectation for every row state and observation kind.
MISMATCH_FIELDS = ("operation_id", "request_fingerprint", "binding_generation")
GATE_ROWS: list[tuple[str, str, str, str, Expect]] = [
    *(
        (record, observation, f"{field}_mismatch", fencing, quarantined(Reason.TUPLE_MISMATCH))
        for record, observation, field, fencing in itertools.product(
            RECORDS, OBSERVATIONS, MISMATCH_FIELDS, FENCING
        )
    ),
    *(
        (record, observation, "unverified", fencing, quarantined(Reason.UNVERIFIED))
        for record, observation, fencing in itertools.product(RECORDS, OBSERVATIONS, FENCING)
    ),
    *(
        (record, observation, "match", "stale", STALE)
        for record, observation in itertools.product(RECORDS, OBSERVATIONS)
    ),
]


@pytest.mark.parametrize(
    ("record_key", "observation_key", "tuple_case", "fencing", "expect"),
    GATE_ROWS,
    ids=[f"{r}--{o}--{t}--fencing_{f}" for r, o, t, f, _ in GATE_ROWS],
)
def test_tuple_gate_decides_before_any_merge(
    record_key: str, observation_key: str, tuple_case: str, fencing: str, expect: Expect
) -> None:
    record = RECORDS[record_key]
    kwargs: dict[str, object] = {"fencing_token": FENCING[fencing]}
    if tuple_case == "unverified":
        kwargs["verified"] = False
    elif tuple_case != "match":
        kwargs["tuple_match"] = False
        kwargs["mismatch"] = tuple_case.removesuffix("_mismatch")
    decision = settle(record, OBSERVATIONS[observation_key](**kwargs), NOW)
    assert_decision(record, decision, expect)
    assert apply_decision(record, decision) is record


# Named behaviours (docs/design.md §4 and the settle.py rules), one scenario each.


def test_timeout_then_matching_success_upgrades_unknown() -> None:
    record = make_record("in_progress", lease="valid")
    timed_out = settle(record, make_observation("unknown", fencing_token=FENCING_TOKEN), NOW)
    assert isinstance(timed_out, Apply)
    assert timed_out.record.state is UNKNOWN
    late = make_observation("completed", source=Source.LATE_RESPONSE)
    upgraded = settle(timed_out.record, late, NOW)
    assert isinstance(upgraded, Apply)
    assert upgraded.reason is Reason.TERMINAL_APPLIED
    assert upgraded.record.state is COMPLETED
    assert upgraded.record.result == late.result
    assert upgraded.record.revision == record.revision + 2


def test_success_then_timeout_keeps_completed() -> None:
    record = make_record("in_progress", lease="valid")
    success = settle(record, make_observation("completed", fencing_token=FENCING_TOKEN), NOW)
    assert isinstance(success, Apply)
    completed = success.record
    timeout = settle(completed, make_observation("unknown", fencing_token=FENCING_TOKEN), NOW)
    assert timeout == Ignore(stage=TERMINAL, reason=Reason.AFTER_TERMINAL)
    assert apply_decision(completed, timeout).state is COMPLETED


def test_quarantined_stale_success_does_not_block_a_later_exact_match() -> None:
    record = make_record("unknown")
    stale_epoch = make_observation("completed", tuple_match=False, digest=NEW_DIGEST)
    assert settle(record, stale_epoch, NOW) == Quarantine(reason=Reason.TUPLE_MISMATCH)
    exact = settle(record, make_observation("completed"), NOW)
    assert isinstance(exact, Apply)
    assert exact.record.state is COMPLETED
    assert exact.record.result == SAME_OK


def test_unverified_evidence_is_quarantined_as_unverified_whatever_tuple_it_claims() -> None:
    record = make_record("unknown")
    forged = make_observation("completed", tuple_match=False, verified=False)
    assert settle(record, forged, NOW) == Quarantine(reason=Reason.UNVERIFIED)


def test_stale_worker_cannot_settle_even_a_matching_success() -> None:
    record = make_record("unknown")
    stale = make_observation("completed", fencing_token=STALE_FENCING_TOKEN)
    assert settle(record, stale, NOW) == Ignore(stage=GATE, reason=Reason.STALE_FENCING_TOKEN)


def test_fencing_token_ahead_of_the_row_is_not_current_either() -> None:
    record = make_record("in_progress", lease="valid")
    ahead = make_observation("unknown", fencing_token=FENCING_TOKEN + 1)
    assert settle(record, ahead, NOW) == Ignore(stage=GATE, reason=Reason.STALE_FENCING_TOKEN)


def test_holder_extends_its_own_lease_without_changing_state() -> None:
    record = make_record("in_progress", lease="valid")
    heartbeat = make_observation("in_progress", lease=OBSERVED_LEASE, fencing_token=FENCING_TOKEN)
    decision = settle(record, heartbeat, NOW)
    assert decision == Apply(
        record=replace(record, revision=record.revision + 1, lease_expires_at=OBSERVED_LEASE),
        expected_revision=record.revision,
        stage=RANK,
        reason=Reason.LEASE_EXTENDED,
    )


@pytest.mark.parametrize(
    "lease", [RECORD_LEASE, RECORD_LEASE - 1.0], ids=["same_expiry", "earlier_expiry"]
)
def test_holder_never_shortens_its_lease(lease: float) -> None:
    record = make_record("in_progress", lease="valid")
    heartbeat = make_observation("in_progress", lease=lease, fencing_token=FENCING_TOKEN)
    assert settle(record, heartbeat, NOW) == Ignore(stage=RANK, reason=Reason.LOWER_OR_EQUAL_RANK)


def test_holder_with_a_live_lease_extends_a_row_whose_lease_is_unknown() -> None:
    # An in_progress row without a known lease ranks as unknown: the report raises it.
    record = make_record("in_progress", lease=None)
    heartbeat = make_observation("in_progress", lease=OBSERVED_LEASE, fencing_token=FENCING_TOKEN)
    decision = settle(record, heartbeat, NOW)
    assert isinstance(decision, Apply)
    assert decision.reason is Reason.RANK_RAISED
    assert decision.record.lease_expires_at == OBSERVED_LEASE


def test_in_progress_row_without_a_lease_is_demoted_by_unknown() -> None:
    record = make_record("in_progress", lease=None)
    decision = settle(record, make_observation("unknown", source=Source.SWEEPER), NOW)
    assert isinstance(decision, Apply)
    assert decision.reason is Reason.LEASE_ENDED
    assert decision.record.state is UNKNOWN
    assert decision.record.lease_expires_at is None


def test_sweeper_cannot_demote_a_live_lease() -> None:
    record = make_record("in_progress", lease="valid")
    sweep = make_observation("unknown", source=Source.SWEEPER)
    assert settle(record, sweep, NOW) == Ignore(stage=RANK, reason=Reason.LOWER_OR_EQUAL_RANK)


def test_lease_ending_exactly_now_counts_as_expired_on_the_row() -> None:
    record = make_record("in_progress", lease=NOW)
    decision = settle(record, make_observation("unknown", source=Source.SWEEPER), NOW)
    assert isinstance(decision, Apply)
    assert decision.reason is Reason.LEASE_ENDED


def test_lease_ending_exactly_now_counts_as_expired_in_the_observation() -> None:
    record = make_record("unknown")
    dead = make_observation("in_progress", lease=NOW)
    assert settle(record, dead, NOW) == Ignore(stage=RANK, reason=Reason.LOWER_OR_EQUAL_RANK)


def test_the_same_row_ranks_by_the_clock_it_is_given() -> None:
    record = make_record("in_progress", lease="valid")
    sweep = make_observation("unknown", source=Source.SWEEPER)
    assert isinstance(settle(record, sweep, NOW), Ignore)
    later = settle(record, sweep, RECORD_LEASE + 1.0)
    assert isinstance(later, Apply)
    assert later.reason is Reason.LEASE_ENDED


def test_non_holder_raising_an_expired_row_takes_the_observed_lease() -> None:
    record = make_record("in_progress", lease="expired")
    decision = settle(record, make_observation("in_progress", lease=OBSERVED_LEASE), NOW)
    assert isinstance(decision, Apply)
    assert decision.record.state is IN_PROGRESS
    assert decision.record.lease_expires_at == OBSERVED_LEASE
    assert decision.record.fencing_token == record.fencing_token


def test_default_policy_turns_completed_vs_failed_into_conflict() -> None:
    record = make_record("completed")
    decision = settle(record, make_observation("failed", digest=NEW_DIGEST), NOW)
    assert isinstance(decision, Apply)
    assert decision.disposition is Disposition.CONFLICT
    assert decision.record.state is CONFLICT


def test_completed_wins_policy_lets_a_success_replace_a_failure() -> None:
    record = make_record("failed")
    success = make_observation("completed", digest=NEW_DIGEST)
    decision = settle(record, success, NOW, policy=TerminalPolicy.COMPLETED_WINS)
    assert isinstance(decision, Apply)
    assert decision.record.state is COMPLETED
    assert decision.record.result == success.result


def test_completed_wins_policy_ignores_a_failure_after_success() -> None:
    record = make_record("completed")
    failure = make_observation("failed", digest=NEW_DIGEST)
    decision = settle(record, failure, NOW, policy=TerminalPolicy.COMPLETED_WINS)
    assert decision == Ignore(stage=TERMINAL, reason=Reason.FAILED_AFTER_COMPLETED)


@pytest.mark.parametrize("policy", list(TerminalPolicy))
def test_completed_wins_policy_still_conflicts_on_two_success_digests(
    policy: TerminalPolicy,
) -> None:
    record = make_record("completed")
    decision = settle(record, make_observation("completed", digest=NEW_DIGEST), NOW, policy)
    assert isinstance(decision, Apply)
    assert decision.reason is Reason.DIFFERENT_DIGEST
    assert decision.record.state is CONFLICT


def test_conflict_grows_with_each_new_digest_and_strengthens_seen_ones() -> None:
    record = make_record("unknown")
    first = settle(record, make_observation("completed", digest="d1"), NOW)
    assert isinstance(first, Apply)
    second = settle(first.record, make_observation("completed", digest="d2"), NOW)
    assert isinstance(second, Apply)
    assert second.disposition is Disposition.CONFLICT
    assert second.record.conflict == make_conflict(("d1", "d2"), (C, C))

    third = settle(second.record, make_observation("failed", digest="d3"), NOW)
    assert isinstance(third, Apply)
    assert third.disposition is Disposition.CONFLICT
    assert third.reason is Reason.DIFFERENT_DIGEST
    assert third.stage is TERMINAL
    assert third.record.state is CONFLICT
    assert third.record.conflict == make_conflict(("d1", "d2", "d3"), (C, C, F))
    assert third.record.result == first.record.result
    assert third.record.revision == record.revision + 3

    for digest in ("d1", "d2", "d3"):
        again = settle(third.record, make_observation("completed", digest=digest), NOW)
        assert again == Strengthen(stage=TERMINAL, reason=Reason.SAME_DIGEST)


@pytest.mark.parametrize(
    "policy", list(TerminalPolicy), ids=[policy.value for policy in TerminalPolicy]
)
def test_conflict_row_grows_under_either_policy(policy: TerminalPolicy) -> None:
    record = make_record("conflict")
    decision = settle(record, make_observation("failed", digest=NEW_DIGEST), NOW, policy)
    assert isinstance(decision, Apply)
    assert decision.record.conflict == make_conflict(
        (STORED_DIGEST, SEEN_DIGEST, NEW_DIGEST), (C, C, F)
    )


@pytest.mark.parametrize("row", APPLY_ROWS, ids=_ids(APPLY_ROWS))
def test_every_apply_bumps_the_revision_by_one_and_expects_the_old_one(row: Row) -> None:
    record = RECORDS[row.record]
    decision = settle(record, observe(row), NOW)
    assert isinstance(decision, Apply)
    assert decision.expected_revision == record.revision
    assert decision.record.revision == record.revision + 1


def test_settle_does_not_touch_the_records_identity() -> None:
    record = make_record("in_progress", lease="expired", revision=41, fencing_token=9)
    decision = settle(record, make_observation("completed"), NOW)
    assert isinstance(decision, Apply)
    assert decision.record.reservation == record.reservation
    assert decision.record.binding == record.binding
    assert decision.record.fencing_token == 9
    assert (decision.expected_revision, decision.record.revision) == (41, 42)


@pytest.mark.parametrize(
    ("kind", "result", "lease", "message"),
    [
        pytest.param(C, None, None, "needs a result", id="completed_without_result"),
        pytest.param(F, None, None, "needs a result", id="failed_without_result"),
        pytest.param(
            ObservationKind.UNKNOWN, SAME_OK, None, "carries no result", id="unknown_with_result"
        ),
        pytest.param(
            ObservationKind.IN_PROGRESS,
            SAME_OK,
            OBSERVED_LEASE,
            "carries no result",
            id="in_progress_with_result",
        ),
        pytest.param(
            ObservationKind.IN_PROGRESS,
            None,
            None,
            "needs lease_expires_at",
            id="in_progress_without_lease",
        ),
    ],
)
def test_malformed_observation_is_rejected_on_construction(
    kind: ObservationKind, result: Result | None, lease: float | None, message: str
) -> None:
    with pytest.raises(InvalidObservation, match=message) as raised_error:
        Observation(
            reservation=make_tuple(),
            kind=kind,
            source=Source.ATTEMPT,
            result=result,
            lease_expires_at=lease,
        )
    assert isinstance(raised_error.value, ValueError)
    assert problem_type(raised_error.value.problem).status == 500


def test_expired_lease_is_still_a_well_formed_in_progress_observation() -> None:
    observation = make_observation("in_progress", lease=EXPIRED_LEASE)
    assert observation.lease_expires_at == EXPIRED_LEASE
