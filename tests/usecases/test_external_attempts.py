"""What an external attempt answers (``Attempts`` through ``IdempotentRequests``): the
provider's definitive answer, no answer in time (504, the call handed to the late answer
keeper; still 504 when ``unknown`` cannot be written), a lost lease, an answer that could
not be recorded yet, an answer settled by another source meanwhile, and a request cancelled
mid-call. On the fakes of :mod:`tests.usecases.fakes`."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import msgspec
import pytest

from service.app.answers import Stored
from service.app.effects import ExecutionContext, IdempotentRoute
from service.core import OperationState, ReservationTuple, Source
from service.domain.payouts import ProviderUnavailable
from service.evidence import SignedEvidence, observation_of
from tests.usecases.world import Gate, Transfer, World, evidence_for, problem, status_of

Provider = Any  # an ExternalHandler: (context, reservation, body) -> SignedEvidence


def external_route(call: Provider) -> IdempotentRoute:
    return IdempotentRoute(route="POST /test/external", body_type=Transfer, external=call)


async def pays(context: ExecutionContext, reservation: ReservationTuple, body: Any) -> Any:
    return evidence_for(reservation, 201, {"paid": body.amount})


async def declines(context: ExecutionContext, reservation: ReservationTuple, body: Any) -> Any:
    return evidence_for(reservation, 402, {"declined": "card"})


async def never_answers(context: ExecutionContext, reservation: ReservationTuple, body: Any) -> Any:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def _row(world: Any) -> Any:
    [record] = world.store.rows.values()
    return record


def _assert_outcome_unknown(answer: Any, world: World) -> None:
    refused = problem(answer)
    assert (refused.slug, status_of(refused), refused.state, refused.retry_after) == (
        "operation-outcome-unknown",
        504,
        "unknown",
        True,
    )
    assert refused.operation_id == _row(world).reservation.operation_id
    assert _row(world).state is OperationState.UNKNOWN


@pytest.mark.parametrize(
    ("provider", "status", "state"),
    [(pays, 201, OperationState.COMPLETED), (declines, 402, OperationState.FAILED)],
    ids=["paid", "declined"],
)
async def test_the_providers_definitive_answer_is_stored_and_replayed(
    world: World, provider: Provider, status: int, state: OperationState
) -> None:
    route = external_route(provider)
    answer = await world.send(route)
    assert isinstance(answer, Stored) and not answer.replayed and status_of(answer) == status
    assert _row(world).state is state
    assert await world.send(route) == msgspec.structs.replace(answer, replayed=True)


@pytest.mark.parametrize(
    "failure",
    [ProviderUnavailable("provider answered 503"), ZeroDivisionError("a bug")],
    ids=["provider-unavailable", "bug"],
)
async def test_no_definitive_answer_is_504_and_a_retry_calls_again(
    world: World, failure: Exception
) -> None:
    calls: list[ReservationTuple] = []

    async def fails_once(
        context: ExecutionContext, reservation: ReservationTuple, body: Any
    ) -> SignedEvidence:
        calls.append(reservation)
        if len(calls) == 1:
            raise failure
        return evidence_for(reservation)

    route = external_route(fails_once)
    _assert_outcome_unknown(await world.send(route), world)
    assert world.late.adopted == []  # the call ended: nothing late to wait for
    retried = await world.send(route)
    assert isinstance(retried, Stored) and not retried.replayed and status_of(retried) == 201
    # the same reservation (the provider's sink key) both times: it never pays twice
    assert calls[0] == calls[1] and _row(world).fencing_token == 2


async def test_no_answer_within_the_provider_timeout_is_504_and_the_call_is_kept_late() -> None:
    world = World(provider_timeout=0.01)
    _assert_outcome_unknown(await world.send(external_route(never_answers)), world)
    [(call, operation_id)] = world.late.adopted
    assert not call.done() and str(operation_id) == _row(world).reservation.operation_id
    await world.close()


async def test_no_answer_in_time_whose_unknown_cannot_be_written_is_still_504(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Writing ``unknown`` fails (the database away): the client is still told 504, the
    call is still kept late, the failure is logged, and the row is left ``in_progress``:
    once its lease runs out a retry's claim (or the sweeper) demotes it."""
    world = World(provider_timeout=0.01)
    calls: list[ReservationTuple] = []

    async def answers_the_second_time(
        context: ExecutionContext, reservation: ReservationTuple, body: Any
    ) -> SignedEvidence:
        calls.append(reservation)
        if len(calls) == 1:
            await asyncio.Event().wait()
        return evidence_for(reservation)

    route = external_route(answers_the_second_time)
    world.store.fail["settle"] = ConnectionResetError("the database went away")
    refused = problem(await world.send(route))
    assert (refused.slug, status_of(refused), refused.state, refused.retry_after) == (
        "operation-outcome-unknown",
        504,
        "unknown",
        True,
    )
    op = _row(world).reservation.operation_id
    assert refused.operation_id == op and _row(world).state is OperationState.IN_PROGRESS
    [(call, operation_id)] = world.late.adopted
    assert not call.done() and str(operation_id) == op
    [logged] = [r for r in caplog.records if "could not record unknown" in r.getMessage()]
    assert logged.levelname == "WARNING" and logged.__dict__["operation_id"] == op
    busy = problem(await world.send(route))  # the row's claim-time lease has not run out
    assert busy.slug == "operation-in-progress" and len(calls) == 1
    world.clock.advance(world.leases.ttl + 1)
    retried = await world.send(route)  # its claim demotes the stale row and calls again
    assert isinstance(retried, Stored) and not retried.replayed and status_of(retried) == 201
    assert calls[0] == calls[1] and _row(world).fencing_token == 2
    await world.close()


async def test_a_lease_lost_during_the_call_is_504_and_the_call_is_kept_late(
    world: World,
) -> None:
    async def loses_its_lease(
        context: ExecutionContext, reservation: ReservationTuple, body: Any
    ) -> SignedEvidence:
        world.leases.steal()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    _assert_outcome_unknown(await world.send(external_route(loses_its_lease)), world)
    assert len(world.late.adopted) == 1


async def test_an_answer_that_cannot_be_recorded_yet_is_503_and_settled_later(
    world: World,
) -> None:
    world.store.fail["settle"] = ConnectionResetError("the database went away")
    answer = problem(await world.send(external_route(pays)))
    assert (answer.slug, status_of(answer), answer.retry_after) == (
        "service-unavailable",
        503,
        True,
    )
    [(operation_id, observation)] = world.late.later
    assert str(operation_id) == answer.operation_id
    assert observation.kind.value == "completed" and observation.source is Source.ATTEMPT


async def test_an_answer_settled_meanwhile_by_other_evidence_is_answered_as_a_replay(
    world: World,
) -> None:
    """The provider's signed evidence reached the server while the call failed: the
    attempt's ``unknown`` loses to it and the client gets the outcome."""

    async def evidence_first(
        context: ExecutionContext, reservation: ReservationTuple, body: Any
    ) -> SignedEvidence:
        signed = evidence_for(reservation)
        await world.store.settle(
            uuid.UUID(reservation.operation_id), observation_of(signed.evidence, Source.EVIDENCE)
        )
        raise ProviderUnavailable("the answer was dropped")

    answer = await world.send(external_route(evidence_first))
    assert isinstance(answer, Stored) and answer.replayed and status_of(answer) == 201
    assert _row(world).state is OperationState.COMPLETED


async def test_a_request_cancelled_mid_call_hands_the_call_to_the_late_keeper(
    world: World,
) -> None:
    gate = Gate()

    async def slow(
        context: ExecutionContext, reservation: ReservationTuple, body: Any
    ) -> SignedEvidence:
        await gate()
        return evidence_for(reservation)

    request = asyncio.create_task(world.send(external_route(slow)))
    await gate.reached.wait()
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    [(call, _)] = world.late.adopted
    assert not call.done()
    gate.opened.set()
    signed = await call
    assert signed.evidence.outcome == "completed"
    assert world.leases.held == {}  # released on the way out


async def test_a_late_call_still_unanswered_after_the_late_window_ends_unavailable() -> None:
    world = World(provider_timeout=0.01, late_response_window=0.01)
    _assert_outcome_unknown(await world.send(external_route(never_answers)), world)
    [(call, _)] = world.late.adopted
    with pytest.raises(ProviderUnavailable, match=r"no answer within 0\.02s"):
        await call
    await world.close()
