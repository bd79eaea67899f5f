"""What a local attempt answers (``Attempts`` through ``IdempotentRequests``): a new success in
one statement or the general way, a stored business failure, an effect the database refuses,
a busy database, a bug, a lost lease (before or after the commit), a fencing refusal and a
supersede while it ran. On the fakes of :mod:`tests.usecases.fakes`."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import msgspec
import pytest

from service.app.answers import Stored
from service.app.effects import PROBLEM_CONTENT_TYPE, ExecutionContext, Outcome
from service.core import OperationState
from service.domain.ledger import BusinessFailure
from service.store.db import PoolTimeout
from service.store.settlement import RowLocked
from tests.usecases.world import (
    LOCAL,
    STATEMENT,
    Gate,
    World,
    credit,
    local_route,
    problem,
    status_of,
)


def _only_row(world: World) -> tuple[str, Any]:
    [(operation_id, record)] = world.store.rows.items()
    return operation_id, record


# -- a new success --------------------------------------------------------------------------------


async def test_a_new_operation_runs_once_and_its_success_is_not_a_replay(world: World) -> None:
    answer = await world.send(LOCAL)
    assert isinstance(answer, Stored) and not answer.replayed
    assert (status_of(answer), msgspec.json.decode(answer.result.body)) == (201, {"moved": 5})
    op, row = _only_row(world)
    assert answer.operation_id == op and row.state is OperationState.COMPLETED
    assert world.store.committed == [("credit", op, 5)]
    # the lease is released with the settlement's wake-up, in one call
    [(_, announced)] = world.leases.released
    assert announced == op and world.leases.held == {}

    again = await world.send(LOCAL)
    assert again == msgspec.structs.replace(answer, replayed=True)
    assert len(world.store.committed) == 1


async def test_a_new_operation_of_a_statement_route_is_claimed_run_and_settled_at_once(
    world: World,
) -> None:
    answer = await world.send(STATEMENT)
    assert isinstance(answer, Stored) and not answer.replayed and status_of(answer) == 201
    op, row = _only_row(world)
    assert row.state is OperationState.COMPLETED and row.fencing_token == 1
    assert world.store.committed == [(op, 5)]  # the statement's write, not the handler's
    assert [announced for _, announced in world.leases.released] == [op]


@pytest.mark.parametrize(
    "refusal",
    [None, RowLocked("lock"), asyncpg.exceptions.DeadlockDetectedError("deadlock")],
    ids=["guard-refused", "row-locked", "deadlock"],
)
async def test_a_statement_that_wrote_nothing_runs_the_effect_the_general_way(
    world: World, refusal: Exception | None
) -> None:
    if refusal is None:
        world.store.statement_applies = False
    else:
        world.store.fail["claim_and_settle_local"] = refusal
    answer = await world.send(STATEMENT)
    assert isinstance(answer, Stored) and not answer.replayed and status_of(answer) == 201
    op, _ = _only_row(world)
    assert world.store.committed == [("credit", op, 5)]


async def test_an_armed_claim_failpoint_claims_a_statement_routes_operation_first() -> None:
    world = World(failpoints={"claim.after": "sleep:0"})
    answer = await world.send(STATEMENT)
    assert isinstance(answer, Stored) and status_of(answer) == 201
    op, _ = _only_row(world)
    assert world.store.committed == [("credit", op, 5)]
    await world.close()


# -- a stored business failure ------------------------------------------------------------------


async def _insufficient(conn: Any, context: ExecutionContext, body: Any) -> Outcome:
    conn.writes.append("half a transfer")
    raise BusinessFailure("insufficient-funds", "the source account has 0")


async def test_a_business_failure_is_stored_as_failed_and_replayed(world: World) -> None:
    route = local_route(_insufficient)
    answer = await world.send(route)
    assert isinstance(answer, Stored) and not answer.replayed
    assert (answer.result.status, answer.result.content_type) == (402, PROBLEM_CONTENT_TYPE)
    document = msgspec.json.decode(answer.result.body)
    assert (document["type"], document["state"]) == ("/problems/insufficient-funds", "failed")
    _, row = _only_row(world)
    assert row.state is OperationState.FAILED
    assert world.store.committed == []  # what the effect wrote before failing rolled back
    assert await world.send(route) == msgspec.structs.replace(answer, replayed=True)


# -- the database refuses or is busy ------------------------------------------------------------


async def _refused(conn: Any, context: ExecutionContext, body: Any) -> Outcome:
    conn.writes.append("a negative balance")
    raise asyncpg.exceptions.CheckViolationError("balance_not_negative")


async def test_an_effect_refused_by_a_constraint_is_409_and_the_attempt_gives_up(
    world: World,
) -> None:
    answer = problem(await world.send(local_route(_refused)))
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
    world.store.fail["claim_and_settle_local"] = asyncpg.exceptions.UniqueViolationError("dup")
    answer = problem(await world.send(STATEMENT))
    assert (answer.slug, status_of(answer), answer.state) == ("effect-refused", 409, None)
    assert answer.operation_id is not None and world.store.rows == {}


@pytest.mark.parametrize(
    ("failure", "slug"),
    [
        (PoolTimeout("no connection"), "service-unavailable"),
        (ConnectionResetError("gone"), "service-unavailable"),
        (RuntimeError("a bug"), "internal-error"),
    ],
    ids=["pool-timeout", "connection-lost", "bug"],
)
async def test_a_new_statement_that_failed_says_retry_and_writes_no_row(
    world: World, failure: Exception, slug: str
) -> None:
    world.store.fail["claim_and_settle_local"] = failure
    answer = problem(await world.send(STATEMENT))
    assert answer.slug == slug and status_of(answer) in (500, 503)
    assert world.store.rows == {}
    assert status_of(await world.send(STATEMENT)) == 201  # the retry runs it


@pytest.mark.parametrize(
    "busy",
    [RowLocked("lock"), PoolTimeout("pool"), TimeoutError(), ConnectionResetError("gone")],
    ids=["row-locked", "pool-timeout", "timeout", "connection-lost"],
)
async def test_a_busy_database_is_503_and_the_attempt_gives_up(
    world: World, busy: Exception
) -> None:
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
    assert world.store.row(world.scope(LOCAL)).fencing_token == 2  # type: ignore[union-attr]


async def test_a_busy_database_that_cannot_take_the_give_up_either_is_still_503(
    world: World,
) -> None:
    world.store.fail["settle_local"] = PoolTimeout("pool")
    world.store.fail["settle"] = PoolTimeout("pool, again")
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, answer.state) == ("service-unavailable", "unknown")
    _, row = _only_row(world)
    assert row.state is OperationState.IN_PROGRESS  # left for the sweeper


async def test_a_bug_in_the_effect_is_500_and_a_retry_runs_it_again(world: World) -> None:
    calls: list[int] = []

    async def flaky(conn: Any, context: ExecutionContext, body: Any) -> Outcome:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("a bug")
        return await credit(conn, context, body)

    route = local_route(flaky)
    answer = problem(await world.send(route))
    assert (answer.slug, status_of(answer), answer.state) == ("internal-error", 500, "unknown")
    _, row = _only_row(world)
    assert row.state is OperationState.UNKNOWN
    retried = await world.send(route)
    assert isinstance(retried, Stored) and not retried.replayed and len(calls) == 2


# -- the lease is lost, the row moved on -------------------------------------------------------


async def test_a_lease_lost_mid_effect_commits_nothing_and_is_503(world: World) -> None:
    async def stalls(conn: Any, context: ExecutionContext, body: Any) -> Outcome:
        conn.writes.append("never committed")
        world.leases.steal()
        await asyncio.Event().wait()  # cancelled by the lost lease
        raise AssertionError("unreachable")

    answer = problem(await world.send(local_route(stalls)))
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

    world.store.after_commit = lose_then_stall
    answer = await world.send(LOCAL)
    assert isinstance(answer, Stored) and not answer.replayed and status_of(answer) == 201
    op, row = _only_row(world)
    assert row.state is OperationState.COMPLETED
    assert world.store.committed == [("credit", op, 5)]


async def test_an_attempt_fenced_out_while_it_ran_commits_nothing_and_is_409(
    world: World,
) -> None:
    """Another attempt claimed the row (the next fencing token) while this one's effect ran:
    the core ignores this attempt's outcome and its writes roll back."""

    async def overtaken(conn: Any, context: ExecutionContext, body: Any) -> Outcome:
        op, row = _only_row(world)
        world.store.rows[op] = msgspec.structs.replace(
            row,
            fencing_token=row.fencing_token + 1,
            revision=row.revision + 1,
            lease_expires_at=world.clock() + 10,
        )
        return await credit(conn, context, body)

    answer = problem(await world.send(local_route(overtaken)))
    assert (answer.slug, status_of(answer), answer.state) == (
        "operation-in-progress",
        409,
        "in_progress",
    )
    _, row = _only_row(world)
    assert row.state is OperationState.IN_PROGRESS and row.fencing_token == 2
    assert world.store.committed == []


async def test_an_attempt_of_a_superseded_epoch_is_409_superseded(world: World) -> None:
    async def superseded(conn: Any, context: ExecutionContext, body: Any) -> Outcome:
        op, row = _only_row(world)
        world.store.rows[op] = msgspec.structs.replace(
            row,
            reservation=msgspec.structs.replace(row.reservation, binding_generation=2),
            state=OperationState.UNKNOWN,
            revision=row.revision + 1,
            lease_expires_at=None,
        )
        return await credit(conn, context, body)

    answer = problem(await world.send(local_route(superseded)))
    assert (answer.slug, status_of(answer), answer.state) == (
        "operation-superseded",
        409,
        "unknown",
    )
    assert world.store.committed == []


async def test_another_outcome_settled_while_the_effect_ran_is_a_conflict(world: World) -> None:
    async def raced(conn: Any, context: ExecutionContext, body: Any) -> Outcome:
        _, row = _only_row(world)
        other = Outcome(status=201, body=b'{"moved": 6}')
        await world.finish(row, other)  # a report of another outcome under this token
        return await credit(conn, context, body)

    answer = problem(await world.send(local_route(raced)))
    assert (answer.slug, status_of(answer), answer.state) == ("operation-conflict", 409, "conflict")
    _, row = _only_row(world)
    assert row.state is OperationState.CONFLICT


async def test_a_lost_connection_wrapped_in_another_error_is_busy_not_a_bug(
    world: World,
) -> None:
    async def wrapped(conn: Any, context: ExecutionContext, body: Any) -> Outcome:
        try:
            raise ConnectionResetError("the database restarted")
        except ConnectionResetError as exc:
            raise RuntimeError("the driver's own error") from exc

    answer = problem(await world.send(local_route(wrapped)))
    assert (answer.slug, status_of(answer), answer.state) == ("service-unavailable", 503, "unknown")


async def test_a_lost_lease_whose_row_cannot_be_read_gives_up_and_is_503(world: World) -> None:
    async def stalls(conn: Any, context: ExecutionContext, body: Any) -> Outcome:
        world.store.fail["get"] = ConnectionResetError("gone")
        world.leases.steal()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    answer = problem(await world.send(local_route(stalls)))
    assert (answer.slug, status_of(answer)) == ("lease-unavailable", 503)
    _, row = _only_row(world)
    assert row.state is OperationState.UNKNOWN


async def test_a_request_cancelled_mid_effect_cancels_the_effect_and_releases_its_lease(
    world: World,
) -> None:
    gate = Gate()

    async def gated(conn: Any, context: ExecutionContext, body: Any) -> Outcome:
        conn.writes.append("never committed")
        await gate()
        return await credit(conn, context, body)

    request = asyncio.create_task(world.send(local_route(gated)))
    await gate.reached.wait()
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert world.store.committed == [] and world.leases.held == {}
    _, row = _only_row(world)
    assert row.state is OperationState.IN_PROGRESS  # the sweeper demotes it once its lease is gone
