"""What a local attempt answers (``Attempts`` through ``IdempotentRequests``): a new success in
one statement or under the row's lock, a business failure its guard names (stored and
replayed), an effect the database refuses, a busy database, a bug, a lost lease (before or
after the commit), a fencing refusal and a supersede while it ran. On the fakes of
:mod:`tests.usecases.fakes`."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from service.app.answers import Stored
from service.app.effects import PROBLEM_CONTENT_TYPE, Outcome
from service.core import OperationState
from service.store.db import DatabaseUnavailable, PoolTimeout, unavailable
from service.store.outcomes import EffectRefused
from service.store.settlement import RowLocked
from tests.usecases.world import LOCAL, Gate, World, local_route, problem, refusing, status_of


def _only_row(world: World) -> tuple[str, Any]:
    [(operation_id, record)] = world.store.rows.items()
    return operation_id, record


# -- a new success --------------------------------------------------------------------------------


async def test_a_new_operation_runs_once_in_one_statement_and_is_not_a_replay(
    world: World,
) -> None:
    answer = await world.send(LOCAL)
    assert isinstance(answer, Stored) and not answer.replayed
    assert (status_of(answer), msgspec.json.decode(answer.result.body)) == (201, {"moved": 5})
    op, row = _only_row(world)
    assert answer.operation_id == op and row.state is OperationState.COMPLETED
    assert row.fencing_token == 1 and len(world.store.claims) == 1
    assert world.store.committed == [(op, 5)]
    # one statement: no lease taken, and no wake-up (nobody could wait on a row that was
    # never seen unsettled)
    assert world.leases.acquired == [] and world.leases.released == []
    assert world.wakeups.announced == []

    again = await world.send(LOCAL)
    assert again == msgspec.structs.replace(answer, replayed=True)
    assert len(world.store.committed) == 1


@pytest.mark.parametrize("refusal", [None, RowLocked("lock")], ids=["row-appeared", "row-locked"])
async def test_a_statement_that_wrote_nothing_runs_the_effect_under_the_rows_lock(
    world: World, refusal: Exception | None
) -> None:
    if refusal is None:
        world.store.one_statement = False
    else:
        world.store.fail["claim_and_settle_local"] = refusal
    ran: list[int] = []

    async def counted() -> None:
        ran.append(1)

    world.store.during_effect = counted
    answer = await world.send(LOCAL)
    assert isinstance(answer, Stored) and not answer.replayed and status_of(answer) == 201
    op, _ = _only_row(world)
    assert world.store.committed == [(op, 5)] and ran == [1]  # under the lock, once


async def test_an_armed_claim_failpoint_claims_the_operation_first() -> None:
    world = World(failpoints={"claim.after": "sleep:0"})
    answer = await world.send(LOCAL)
    assert isinstance(answer, Stored) and status_of(answer) == 201
    op, _ = _only_row(world)
    assert world.store.committed == [(op, 5)]
    await world.close()


# -- a business failure its guard names --------------------------------------------------------


@pytest.mark.parametrize("one_statement", [True, False], ids=["one-statement", "locked"])
async def test_a_refusal_of_the_guard_is_stored_as_failed_and_replayed(
    world: World, one_statement: bool
) -> None:
    world.store.one_statement = one_statement
    route = local_route(refusing("insufficient-funds", "the source account has 0"))
    answer = await world.send(route)
    assert isinstance(answer, Stored) and not answer.replayed
    assert (answer.result.status, answer.result.content_type) == (402, PROBLEM_CONTENT_TYPE)
    document = msgspec.json.decode(answer.result.body)
    assert (document["type"], document["state"]) == ("/problems/insufficient-funds", "failed")
    assert document["detail"] == "the source account has 0"
    _, row = _only_row(world)
    assert row.state is OperationState.FAILED
    assert world.store.committed == []  # a refused effect writes nothing
    assert await world.send(route) == msgspec.structs.replace(answer, replayed=True)


# -- the database refuses or is busy ------------------------------------------------------------


async def test_an_effect_refused_by_a_constraint_is_409_and_the_attempt_gives_up(
    world: World,
) -> None:
    world.store.one_statement = False
    world.store.fail["settle_local"] = EffectRefused("balance_not_negative")
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer), answer.state, answer.retry_after) == (
        "effect-refused",
        409,
        "unknown",
        True,
    )
    op, row = _only_row(world)
    assert answer.operation_id == op and row.state is OperationState.UNKNOWN
    assert world.store.committed == []


async def test_a_new_statement_refused_by_a_constraint_is_409_and_writes_no_row(
    world: World,
) -> None:
    world.store.fail["claim_and_settle_local"] = EffectRefused("uq_accounts_operation")
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer), answer.state) == ("effect-refused", 409, None)
    assert answer.operation_id is not None and world.store.rows == {}


@pytest.mark.parametrize(
    ("failure", "slug"),
    [
        (PoolTimeout("no connection"), "service-unavailable"),
        (DatabaseUnavailable("connection lost"), "service-unavailable"),
        (RuntimeError("a bug"), "internal-error"),
    ],
    ids=["pool-timeout", "connection-lost", "bug"],
)
async def test_a_new_statement_that_failed_says_retry_and_writes_no_row(
    world: World, failure: Exception, slug: str
) -> None:
    world.store.fail["claim_and_settle_local"] = failure
    answer = problem(await world.send(LOCAL))
    assert answer.slug == slug and status_of(answer) in (500, 503)
    assert world.store.rows == {}
    assert status_of(await world.send(LOCAL)) == 201  # the retry runs it


@pytest.mark.parametrize(
    "busy",
    [RowLocked("lock"), PoolTimeout("pool"), TimeoutError(), DatabaseUnavailable("lost")],
    ids=["row-locked", "pool-timeout", "timeout", "connection-lost"],
)
async def test_a_busy_database_is_503_and_the_attempt_gives_up(
    world: World, busy: Exception
) -> None:
    world.store.one_statement = False
    world.store.fail["settle_local"] = busy
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer), answer.state, answer.retry_after) == (
        "service-unavailable",
        503,
        "unknown",
        True,
    )
    _, row = _only_row(world)
    assert row.state is OperationState.UNKNOWN
    retried = await world.send(LOCAL)
    assert isinstance(retried, Stored) and not retried.replayed
    row = world.store.row(world.scope(LOCAL))
    assert row is not None and row.fencing_token == 2


async def test_a_busy_database_that_cannot_take_the_give_up_either_is_still_503(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.store.one_statement = False
    world.store.fail["settle_local"] = PoolTimeout("pool")
    world.store.fail["settle"] = PoolTimeout("pool, again")
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, answer.state) == ("service-unavailable", "unknown")
    _, row = _only_row(world)
    assert row.state is OperationState.IN_PROGRESS  # left for the sweeper
    assert "could not report unknown" in caplog.text  # said, not swallowed


async def test_a_bug_in_the_effect_is_500_and_a_retry_runs_it_again(world: World) -> None:
    calls: list[int] = []

    async def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("a bug")

    world.store.one_statement = False  # under the row's lock
    world.store.during_effect = flaky
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer), answer.state) == ("internal-error", 500, "unknown")
    _, row = _only_row(world)
    assert row.state is OperationState.UNKNOWN
    retried = await world.send(LOCAL)
    assert isinstance(retried, Stored) and not retried.replayed and len(calls) == 2


# -- the lease is lost, the row moved on -------------------------------------------------------


async def test_a_lease_lost_mid_effect_commits_nothing_and_is_503(world: World) -> None:
    async def stalls() -> None:
        world.leases.steal()
        await asyncio.Event().wait()  # cancelled by the lost lease
        raise AssertionError("unreachable")

    world.store.one_statement = False  # under the row's lock
    world.store.during_effect = stalls

    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer), answer.retry_after) == ("lease-unavailable", 503, True)
    op, row = _only_row(world)
    assert answer.operation_id == op
    assert row.state is OperationState.UNKNOWN  # the attempt gave up
    assert world.store.committed == []


async def test_a_lease_lost_after_the_commit_answers_the_attempts_own_outcome(
    world: World,
) -> None:
    async def lose_then_stall() -> None:
        world.leases.steal()
        await asyncio.Event().wait()

    world.store.one_statement = False  # under the row's lock
    world.store.after_commit = lose_then_stall
    answer = await world.send(LOCAL)
    assert isinstance(answer, Stored) and not answer.replayed and status_of(answer) == 201
    op, row = _only_row(world)
    assert row.state is OperationState.COMPLETED
    assert world.store.committed == [(op, 5)]


async def test_an_attempt_fenced_out_while_it_ran_commits_nothing_and_is_409(
    world: World,
) -> None:
    """Another attempt claimed the row (the next fencing token) while this one's effect ran:
    the core ignores this attempt's outcome and its writes roll back."""

    async def overtaken() -> None:
        op, row = _only_row(world)
        world.store.rows[op] = msgspec.structs.replace(
            row,
            fencing_token=row.fencing_token + 1,
            revision=row.revision + 1,
            lease_expires_at=world.clock() + 10,
        )

    world.store.one_statement = False  # under the row's lock
    world.store.during_effect = overtaken

    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer), answer.state) == (
        "operation-in-progress",
        409,
        "in_progress",
    )
    _, row = _only_row(world)
    assert row.state is OperationState.IN_PROGRESS and row.fencing_token == 2
    assert world.store.committed == []


async def test_an_attempt_of_a_superseded_epoch_is_409_superseded(world: World) -> None:
    async def superseded() -> None:
        op, row = _only_row(world)
        world.store.rows[op] = msgspec.structs.replace(
            row,
            reservation=msgspec.structs.replace(row.reservation, binding_generation=2),
            state=OperationState.UNKNOWN,
            revision=row.revision + 1,
            lease_expires_at=None,
        )

    world.store.one_statement = False  # under the row's lock
    world.store.during_effect = superseded

    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer), answer.state) == (
        "operation-superseded",
        409,
        "unknown",
    )
    assert world.store.committed == []


async def test_another_outcome_settled_while_the_effect_ran_is_a_conflict(world: World) -> None:
    async def raced() -> None:
        _, row = _only_row(world)
        other = Outcome(status=201, body=b'{"moved": 6}')
        await world.finish(row, other)  # a report of another outcome under this token

    world.store.one_statement = False  # under the row's lock
    world.store.during_effect = raced

    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer), answer.state) == ("operation-conflict", 409, "conflict")
    _, row = _only_row(world)
    assert row.state is OperationState.CONFLICT


async def test_a_lost_connection_wrapped_in_another_error_is_busy_not_a_bug(
    world: World,
) -> None:
    async def wrapped() -> None:
        try:
            raise ConnectionResetError("the database restarted")
        except ConnectionResetError as exc:
            try:
                raise RuntimeError("the driver's own error") from exc
            except RuntimeError as driver:
                gone = unavailable(driver)  # what the store raises in the driver's place
                assert gone is not None
                raise gone from driver

    world.store.one_statement = False  # under the row's lock
    world.store.during_effect = wrapped

    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer), answer.state) == ("service-unavailable", 503, "unknown")


async def test_a_lost_lease_whose_row_cannot_be_read_gives_up_and_is_503(world: World) -> None:
    async def stalls() -> None:
        world.store.fail["get"] = ConnectionResetError("gone")
        world.leases.steal()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    world.store.one_statement = False  # under the row's lock
    world.store.during_effect = stalls

    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer)) == ("lease-unavailable", 503)
    _, row = _only_row(world)
    assert row.state is OperationState.UNKNOWN


async def test_a_request_cancelled_mid_effect_cancels_the_effect_and_releases_its_lease(
    world: World,
) -> None:
    gate = Gate()

    async def gated() -> None:
        await gate()

    world.store.one_statement = False  # under the row's lock
    world.store.during_effect = gated

    request = asyncio.create_task(world.send(LOCAL))
    await gate.reached.wait()
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert world.store.committed == [] and world.leases.held == {}
    _, row = _only_row(world)
    assert row.state is OperationState.IN_PROGRESS  # the sweeper demotes it once its lease is gone
