"""Properties of the settlement merge that must hold for every input (docs/design.md §4).

"Applying" a decision means what the shell does: on Apply the row becomes ``decision.record``,
otherwise it stays as it was. Clocks are drawn around ``NOW`` so leases are sometimes valid,
sometimes expired, and never move backwards within one sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from service.core import (
    Apply,
    ConflictInfo,
    Disposition,
    Observation,
    ObservationKind,
    OperationState,
    Quarantine,
    Record,
    ReservationTuple,
    Source,
    Stage,
    TerminalPolicy,
    settle,
)

from .factories import (
    FAILURE_STATUS,
    LEASE_TTL,
    NOW,
    SUCCESS_STATUS,
    apply_decision,
    make_record,
    make_result,
    replace,
)

PROPERTY = settings(deadline=None)

NON_TERMINAL_KINDS = (ObservationKind.IN_PROGRESS, ObservationKind.UNKNOWN)
TERMINAL_KINDS = (ObservationKind.COMPLETED, ObservationKind.FAILED)

times = st.floats(
    min_value=NOW - 3 * LEASE_TTL,
    max_value=NOW + 3 * LEASE_TTL,
    allow_nan=False,
    allow_infinity=False,
)
digests = st.sampled_from(["d1", "d2", "d3", "d4", "d5"])
policies = st.sampled_from(TerminalPolicy)
sources = st.sampled_from(Source)
revisions = st.integers(min_value=1, max_value=10_000)
fencing_tokens = st.integers(min_value=1, max_value=1_000)
reservations = st.builds(
    ReservationTuple,
    operation_id=st.sampled_from(["op-1", "op-2"]),
    request_fingerprint=st.sampled_from(["fp-1", "fp-2"]),
    binding_generation=st.integers(min_value=1, max_value=3),
)


def _status(kind: ObservationKind | OperationState) -> int:
    return SUCCESS_STATUS if kind.value == "completed" else FAILURE_STATUS


@st.composite
def non_terminal_records(draw: st.DrawFn) -> Record:
    state = draw(st.sampled_from([OperationState.IN_PROGRESS, OperationState.UNKNOWN]))
    lease = draw(st.none() | times) if state is OperationState.IN_PROGRESS else None
    return make_record(
        state,
        lease=lease,
        reservation=draw(reservations),
        revision=draw(revisions),
        fencing_token=draw(fencing_tokens),
    )


@st.composite
def terminal_records(draw: st.DrawFn) -> Record:
    state = draw(
        st.sampled_from([OperationState.COMPLETED, OperationState.FAILED, OperationState.CONFLICT])
    )
    common: dict[str, Any] = {
        "reservation": draw(reservations),
        "revision": draw(revisions),
        "fencing_token": draw(fencing_tokens),
    }
    if state is OperationState.CONFLICT:
        seen = draw(st.lists(digests, min_size=2, max_size=4, unique=True))
        kinds = draw(
            st.lists(st.sampled_from(TERMINAL_KINDS), min_size=len(seen), max_size=len(seen))
        )
        return make_record(
            state,
            result=make_result(seen[0], _status(kinds[0])),
            conflict=ConflictInfo(digests=tuple(seen), kinds=tuple(kinds)),
            **common,
        )
    return make_record(state, result=make_result(draw(digests), _status(state)), **common)


records = non_terminal_records() | terminal_records()


@st.composite
def observations(
    draw: st.DrawFn,
    record: Record,
    *,
    kinds: Sequence[ObservationKind] = tuple(ObservationKind),
    digest: str | None = None,
    fencing: str = "any",
    foreign: bool = False,
) -> Observation:
    """An observation about ``record``.

    ``fencing``: "current" (None or the row's token) or "any" (also stale or ahead tokens).
    ``foreign``: the observation is unverified, or carries another tuple, or both; otherwise
    it is verified and matches the row's tuple.
    """
    kind = draw(st.sampled_from(kinds))
    tokens = [None, record.fencing_token]
    if fencing == "any":
        tokens += [record.fencing_token - 1, record.fencing_token + 1]
    reservation = record.reservation
    verified = True
    if foreign:
        how = draw(st.sampled_from(["unverified", "other_tuple", "both"]))
        verified = how == "other_tuple"
        if how != "unverified":
            reservation = draw(reservations.filter(lambda other: other != record.reservation))
    result = None
    if kind.terminal:
        result = make_result(digest if digest is not None else draw(digests), _status(kind))
    return Observation(
        reservation=reservation,
        kind=kind,
        source=draw(sources),
        result=result,
        lease_expires_at=draw(times) if kind is ObservationKind.IN_PROGRESS else None,
        fencing_token=draw(st.sampled_from(tokens)),
        verified=verified,
    )


def noise(record: Record) -> st.SearchStrategy[Observation]:
    """Tuple-matching non-terminal observations from the holder or from no attempt at all."""
    return observations(record, kinds=NON_TERMINAL_KINDS, fencing="current")


def success(record: Record, digest: str) -> st.SearchStrategy[Observation]:
    return observations(
        record, kinds=(ObservationKind.COMPLETED,), digest=digest, fencing="current"
    )


def clocks(steps: int) -> st.SearchStrategy[list[float]]:
    """One clock reading per step, never moving backwards."""
    return st.lists(times, min_size=steps, max_size=steps).map(sorted)


def final_row(
    record: Record,
    sequence: Sequence[Observation],
    nows: Sequence[float],
    policy: TerminalPolicy,
) -> Record:
    for observation, now in zip(sequence, nows, strict=True):
        record = apply_decision(record, settle(record, observation, now, policy))
    return record


@PROPERTY
@given(data=st.data())
def test_success_wins_in_any_arrival_order(data: st.DataObject) -> None:
    start = data.draw(non_terminal_records())
    digest = data.draw(digests)
    successes = data.draw(st.lists(success(start, digest), min_size=1, max_size=3))
    background = data.draw(st.lists(noise(start), max_size=6))
    order = data.draw(st.permutations([*background, *successes]))
    policy = data.draw(policies)

    final = final_row(start, order, data.draw(clocks(len(order))), policy)

    assert final.state is OperationState.COMPLETED
    assert final.result == make_result(digest, SUCCESS_STATUS)
    assert final.conflict is None
    assert final.lease_expires_at is None


@PROPERTY
@given(data=st.data())
def test_terminal_row_never_returns_to_non_terminal(data: st.DataObject) -> None:
    record = data.draw(terminal_records())
    sequence = data.draw(
        st.lists(
            observations(record, foreign=False) | observations(record, foreign=True), max_size=8
        )
    )
    policy = data.draw(policies)
    for observation, now in zip(sequence, data.draw(clocks(len(sequence))), strict=True):
        record = apply_decision(record, settle(record, observation, now, policy))
        assert record.state.terminal


@PROPERTY
@given(data=st.data())
def test_foreign_or_unverified_observation_is_quarantined(data: st.DataObject) -> None:
    record = data.draw(records)
    observation = data.draw(observations(record, foreign=True))
    decision = settle(record, observation, data.draw(times), data.draw(policies))
    assert isinstance(decision, Quarantine)
    assert decision.stage is Stage.TUPLE_GATE
    assert decision.disposition is Disposition.QUARANTINED
    assert apply_decision(record, decision) is record


@PROPERTY
@given(data=st.data())
def test_two_success_digests_conflict_in_either_order(data: st.DataObject) -> None:
    start = data.draw(non_terminal_records())
    first_digest, second_digest = data.draw(st.lists(digests, min_size=2, max_size=2, unique=True))
    first = data.draw(success(start, first_digest))
    second = data.draw(success(start, second_digest))
    before, between, after = (data.draw(st.lists(noise(start), max_size=3)) for _ in range(3))
    policy = data.draw(policies)

    orders = [(first, first_digest, second, second_digest)]
    orders.append((second, second_digest, first, first_digest))
    for one, one_digest, other, other_digest in orders:
        sequence = [*before, one, *between, other, *after]
        final = final_row(start, sequence, data.draw(clocks(len(sequence))), policy)
        assert final.state is OperationState.CONFLICT
        assert final.result == one.result
        assert final.conflict == ConflictInfo(
            digests=(one_digest, other_digest),
            kinds=(ObservationKind.COMPLETED, ObservationKind.COMPLETED),
        )


@PROPERTY
@given(data=st.data())
def test_settling_the_same_observation_twice_equals_settling_it_once(
    data: st.DataObject,
) -> None:
    record = data.draw(records)
    observation = data.draw(observations(record) | observations(record, foreign=True))
    now = data.draw(times)
    policy = data.draw(policies)

    once = apply_decision(record, settle(record, observation, now, policy))
    again = settle(once, observation, now, policy)

    assert not isinstance(again, Apply)
    assert apply_decision(once, again) == once


@PROPERTY
@given(data=st.data())
def test_repeating_a_lease_report_on_a_non_terminal_row_changes_nothing(
    data: st.DataObject,
) -> None:
    # The same property as above, drawn where the rank merge decides (heartbeats, timeouts).
    record = data.draw(non_terminal_records())
    observation = data.draw(noise(record))
    now = data.draw(times)

    once = apply_decision(record, settle(record, observation, now))
    again = settle(once, observation, now)

    assert not isinstance(again, Apply)
    assert apply_decision(once, again) == once


@PROPERTY
@given(data=st.data())
def test_revision_strictly_increases_on_every_apply(data: st.DataObject) -> None:
    record = data.draw(records)
    sequence = data.draw(st.lists(observations(record), max_size=10))
    policy = data.draw(policies)
    for observation, now in zip(sequence, data.draw(clocks(len(sequence))), strict=True):
        decision = settle(record, observation, now, policy)
        if isinstance(decision, Apply):
            assert decision.expected_revision == record.revision
            assert decision.record.revision == record.revision + 1
            assert decision.record.reservation == record.reservation
            assert decision.record.binding == record.binding
            assert decision.record.fencing_token == record.fencing_token
            assert replace(decision.record, revision=record.revision) != record
        record = apply_decision(record, decision)
