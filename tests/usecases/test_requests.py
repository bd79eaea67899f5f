"""What an idempotent request answers before and around its attempt (``IdempotentRequests``):
replays and refusals decided on the first read, the lease, ``Prefer: wait``, the principal's
slots and an expired key. On the fakes of :mod:`tests.usecases.fakes`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta
from urllib.parse import urlencode

from service.app.answers import Answer, Stored
from service.app.requests import Seen
from service.core import OperationState
from service.store.outcomes import KeyExpired
from service.store.retention import Tombstone
from service.store.rows import at
from service.store.settlement import RowLocked, SettlementContention
from tests.usecases.world import (
    EXTERNAL,
    KEY,
    LOCAL,
    Gate,
    Transfer,
    World,
    local_route,
    outcome_of,
    problem,
    status_of,
)

# -- decided on the first read: no lease is taken ------------------------------------------------


async def test_a_completed_operation_is_replayed_without_a_lease_or_a_claim(world: World) -> None:
    record = world.existing(LOCAL, "completed")
    answer = await world.send(LOCAL)
    assert record.result is not None  # a completed row's
    assert answer == Stored(
        result=record.result,
        operation_id=record.reservation.operation_id,
        replayed=True,
    )
    assert status_of(answer) == 201
    assert world.leases.acquired == [] and world.store.claims == []


async def test_another_body_under_the_same_key_is_a_fingerprint_mismatch(world: World) -> None:
    record = world.existing(LOCAL, "completed", body=Transfer(amount=5))
    answer = problem(await world.send(LOCAL, Transfer(amount=6)))
    assert (answer.slug, status_of(answer)) == ("fingerprint-mismatch", 422)
    assert answer.operation_id == record.reservation.operation_id
    assert world.leases.acquired == []


async def test_a_row_of_an_older_credential_generation_is_a_binding_mismatch(
    world: World,
) -> None:
    record = world.existing(LOCAL, "completed", credential_generation=0)
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer)) == ("binding-mismatch", 409)
    assert answer.operation_id == record.reservation.operation_id
    assert world.leases.acquired == []


async def test_a_row_in_conflict_answers_the_conflict(world: World) -> None:
    record = world.existing(LOCAL, "conflict")
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer), answer.state) == ("operation-conflict", 409, "conflict")
    assert answer.operation_id == record.reservation.operation_id


async def test_a_row_whose_claim_time_lease_is_live_is_in_progress_with_retry_info(
    world: World,
) -> None:
    record = world.existing(LOCAL, "in_progress", lease_expires_at=world.clock() + 5)
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer)) == ("operation-in-progress", 409)
    op = record.reservation.operation_id
    assert (answer.operation_id, answer.state, answer.retry_after) == (op, "in_progress", True)
    assert answer.location == f"/v1/operations/{op}"
    assert world.leases.acquired == []


# -- an expired key (retention) ------------------------------------------------------------------


def _tombstone(world: World, operation_id: uuid.UUID, *, forget_in: float) -> Tombstone:
    now = at(world.clock())
    return Tombstone(
        tenant=world.principal.tenant,
        principal_id=world.principal.id,
        operation_id=operation_id,
        request_fingerprint="0" * 64,
        final_state="completed",
        expired_at=now - timedelta(seconds=10),
        forget_at=now + timedelta(seconds=forget_in),
    )


async def test_a_key_whose_operation_was_purged_is_410_until_its_tombstone_is_forgotten(
    world: World,
) -> None:
    stone = _tombstone(world, uuid.uuid4(), forget_in=60)
    world.store.tombstones[world.scope(LOCAL)] = stone
    answer = problem(await world.send(LOCAL, Transfer(amount=99)))  # whatever the body
    assert (answer.slug, status_of(answer)) == ("idempotency-key-expired", 410)
    assert answer.operation_id == str(stone.operation_id)
    assert answer.forget_at == stone.forget_at.isoformat()
    assert answer.expired_at == stone.expired_at.isoformat()
    assert world.leases.acquired == []

    world.clock.advance(61)  # forgotten: the key is new again
    assert status_of(await world.send(LOCAL)) == 201


async def test_a_purge_between_the_first_read_and_the_claim_is_410_with_its_tombstone(
    world: World,
) -> None:
    purged = uuid.uuid4()
    stone = _tombstone(world, purged, forget_in=60)
    world.tombstones.stones[purged] = stone
    world.store.one_statement = False  # the claim comes first
    world.store.fail["claim"] = KeyExpired(purged)
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer)) == ("idempotency-key-expired", 410)
    assert (answer.operation_id, answer.forget_at) == (str(purged), stone.forget_at.isoformat())
    assert world.store.committed == []
    assert world.leases.held == {}  # released


async def test_a_purge_whose_tombstone_is_gone_too_is_still_410(world: World) -> None:
    purged = uuid.uuid4()
    world.store.fail["claim_and_settle_local"] = KeyExpired(purged)
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer)) == ("idempotency-key-expired", 410)
    assert (answer.operation_id, answer.forget_at) == (str(purged), None)


# -- the store refuses for now -------------------------------------------------------------------


async def test_a_row_lock_not_granted_is_in_progress_pointing_at_the_key_lookup(
    world: World,
) -> None:
    world.store.one_statement = False  # the claim comes first
    world.store.fail["claim"] = RowLocked("lock timeout")
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer), answer.retry_after) == (
        "operation-in-progress",
        409,
        True,
    )
    assert answer.location == "/v1/operations?" + urlencode({"key": KEY, "route": LOCAL.route})
    assert world.leases.held == {}


async def test_a_revision_that_kept_moving_is_503_to_retry(world: World) -> None:
    world.store.one_statement = False  # the claim comes first
    world.store.fail["claim"] = SettlementContention("16 rounds")
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, status_of(answer), answer.retry_after) == (
        "service-unavailable",
        503,
        True,
    )


# -- the lease --------------------------------------------------------------------------------


async def test_no_lease_store_means_no_execution_503(world: World) -> None:
    """An attempt that outlives one statement (here an external one) needs the lease."""
    world.leases.unavailable = True
    answer = problem(await world.send(EXTERNAL))
    assert (answer.slug, status_of(answer), answer.retry_after) == ("lease-unavailable", 503, True)
    assert answer.operation_id is None
    assert world.store.rows == {}


async def test_a_new_local_operation_needs_no_lease_store(world: World) -> None:
    """Claimed, run and settled in one statement, it takes no lease: it runs with the lease
    store away, once."""
    world.leases.unavailable = True
    answer = await world.send(LOCAL)
    assert isinstance(answer, Stored) and status_of(answer) == 201 and not answer.replayed
    [(op, row)] = world.store.rows.items()
    assert row.state is OperationState.COMPLETED and world.store.committed == [(op, 5)]
    assert world.leases.acquired == []
    again = await world.send(LOCAL)
    assert isinstance(again, Stored) and again.replayed
    assert world.store.committed == [(op, 5)]


async def test_no_lease_store_names_the_operation_of_an_existing_row(world: World) -> None:
    record = world.existing(LOCAL, "unknown")
    world.leases.unavailable = True
    answer = problem(await world.send(LOCAL))
    assert (answer.slug, answer.operation_id) == (
        "lease-unavailable",
        record.reservation.operation_id,
    )
    assert world.store.row(world.scope(LOCAL)) == record  # not claimed


async def test_a_lease_held_elsewhere_for_a_new_key_is_409_without_reading_the_row(
    world: World,
) -> None:
    world.leases.hold(world.scope(EXTERNAL).lease_name())
    world.store.fail["get_by_scope"] = AssertionError("no re-read without a wait")
    answer = problem(await world.send(EXTERNAL))
    assert (answer.slug, status_of(answer), answer.operation_id) == (
        "operation-in-progress",
        409,
        None,
    )
    assert answer.location == "/v1/operations?" + urlencode({"key": KEY, "route": EXTERNAL.route})


async def test_a_lease_held_over_an_unknown_row_is_409_naming_its_operation(world: World) -> None:
    record = world.existing(LOCAL, "unknown")
    world.leases.hold(world.scope(LOCAL).lease_name())
    answer = problem(await world.send(LOCAL))
    op = record.reservation.operation_id
    assert (answer.slug, answer.operation_id, answer.location) == (
        "operation-in-progress",
        op,
        f"/v1/operations/{op}",
    )


async def test_a_dead_attempts_row_is_claimed_anew_and_run(world: World) -> None:
    """An in_progress row whose claim-time lease ran out, and no lease in Redis: the dead
    attempt is demoted and the request runs under the next fencing token."""
    record = world.existing(LOCAL, "in_progress", lease_expires_at=world.clock() - 1)
    answer = await world.send(LOCAL)
    assert isinstance(answer, Stored) and not answer.replayed
    row = world.store.row(world.scope(LOCAL))
    assert row is not None and row.state is OperationState.COMPLETED
    assert row.fencing_token == record.fencing_token + 1


# -- Prefer: wait --------------------------------------------------------------------------------


async def test_prefer_wait_answers_the_outcome_settled_while_it_waited(world: World) -> None:
    record = world.existing(LOCAL, "in_progress", lease_expires_at=world.clock() + 5)
    waiting = asyncio.create_task(world.send(LOCAL, wait=30))
    await world.wakeups.waiting.wait()
    await world.finish(record, outcome_of(Transfer(amount=5)))  # the live attempt elsewhere
    answer = await asyncio.wait_for(waiting, 5)
    assert isinstance(answer, Stored)
    assert (answer.operation_id, answer.replayed, answer.preference_applied) == (
        record.reservation.operation_id,
        True,
        "wait=30",
    )
    assert status_of(answer) == 201


async def test_prefer_wait_on_an_attempt_that_ends_without_an_outcome_says_so_at_once(
    world: World,
) -> None:
    record = world.existing(LOCAL, "in_progress", lease_expires_at=world.clock() + 5)
    waiting = asyncio.create_task(world.send(LOCAL, wait=30))
    await world.wakeups.waiting.wait()
    await world.finish(record)  # unknown
    answer = problem(await asyncio.wait_for(waiting, 5))
    assert (answer.slug, status_of(answer), answer.state, answer.retry_after) == (
        "operation-in-progress",
        409,
        "unknown",
        True,
    )
    assert answer.operation_id == record.reservation.operation_id


async def test_prefer_wait_past_its_deadline_is_the_in_progress_409(world: World) -> None:
    record = world.existing(LOCAL, "in_progress", lease_expires_at=world.clock() + 5)
    answer = problem(await world.send(LOCAL, wait=0.01))
    assert (answer.slug, answer.state, answer.operation_id) == (
        "operation-in-progress",
        "in_progress",
        record.reservation.operation_id,
    )
    assert answer.preference_applied is None


async def test_prefer_wait_that_cannot_subscribe_is_the_in_progress_409(world: World) -> None:
    record = world.existing(LOCAL, "in_progress", lease_expires_at=world.clock() + 5)
    world.wakeups.subscribable = False
    answer = problem(await world.send(LOCAL, wait=30))
    assert (answer.slug, answer.operation_id) == (
        "operation-in-progress",
        record.reservation.operation_id,
    )


async def test_prefer_wait_on_a_settled_row_found_by_its_re_read_replays_it(
    world: World,
) -> None:
    """The lease is still held, but the row settled before the subscription: the re-read
    inside the subscription finds it, no wake-up needed."""
    world.existing(EXTERNAL, "completed")
    world.leases.hold(world.scope(EXTERNAL).lease_name())
    # the first read saw no row (the winner had not inserted it yet)
    answer = await world.requests.handle(
        EXTERNAL, world.principal, Seen(key=KEY, record=None), Transfer(amount=5), wait=30
    )
    assert isinstance(answer, Stored) and answer.preference_applied == "wait=30"
    assert not world.wakeups.waiting.is_set()


async def test_prefer_wait_on_a_new_key_whose_winner_has_no_row_yet_is_409(world: World) -> None:
    world.leases.hold(world.scope(EXTERNAL).lease_name())
    answer = problem(await world.send(EXTERNAL, wait=30))
    assert (answer.slug, answer.operation_id) == ("operation-in-progress", None)
    assert answer.location == "/v1/operations?" + urlencode({"key": KEY, "route": EXTERNAL.route})


async def test_prefer_wait_with_another_body_is_still_a_fingerprint_mismatch(
    world: World,
) -> None:
    record = world.existing(LOCAL, "in_progress", lease_expires_at=world.clock() + 5)
    waiting = asyncio.create_task(world.send(LOCAL, Transfer(amount=7), wait=30))
    answer = problem(await asyncio.wait_for(waiting, 5))
    assert (answer.slug, answer.operation_id) == (
        "fingerprint-mismatch",
        record.reservation.operation_id,
    )


# -- the principal's slots -------------------------------------------------------------------


async def test_a_principal_past_its_slots_for_too_long_gets_429() -> None:
    crowded = World(per_principal=1, slot_wait=0.01)
    gate = Gate()

    crowded.store.one_statement = False  # the effect runs (and holds) under the row's lock
    crowded.store.during_effect = gate
    route = LOCAL
    first = asyncio.create_task(crowded.send(route, key="first"))
    await gate.reached.wait()
    answer = problem(await crowded.send(route, key="second"))
    assert (answer.slug, status_of(answer), answer.retry_after) == (
        "too-many-requests",
        429,
        True,
    )
    # its lease is released, its scope has no row
    assert crowded.store.row(crowded.scope(route, "second")) is None
    assert crowded.scope(route, "second").lease_name() not in crowded.leases.held
    gate.opened.set()
    assert status_of(await first) == 201
    await crowded.close()


# An armed claim failpoint puts new local operations on the locked path: claimed first under
# the scope's lease, then settled under the row's lock (the path whose lease these tests watch).
LOCKED_PATH = {"claim.after": "sleep:0"}


async def _queued_behind_another(
    crowded: World, then: Callable[[World, str], None]
) -> tuple[Answer, list[int]]:
    """A second request of the principal queues for its only slot after taking its lease;
    ``then(world, lease name)`` happens while it queues; the first then finishes. Returns
    the second's answer and the effects that ran (counted)."""
    gate = Gate()
    ran: list[int] = []

    async def recorded() -> None:
        ran.append(len(ran) + 1)
        if len(ran) == 1:
            await gate()

    crowded.store.during_effect = recorded
    route = LOCAL
    first = asyncio.create_task(crowded.send(route, key="first"))
    await gate.reached.wait()
    crowded.leases.acquiring.clear()
    second = asyncio.create_task(crowded.send(route, key="second"))
    await crowded.leases.acquiring.wait()  # it holds its lease and waits for the slot
    then(crowded, crowded.scope(route, "second").lease_name())
    gate.opened.set()
    assert status_of(await first) == 201
    return await second, ran


async def test_a_request_that_queued_past_half_its_lease_renews_it_before_its_claim() -> None:
    crowded = World(per_principal=1, ttl=10, failpoints=LOCKED_PATH)
    answer, ran = await _queued_behind_another(crowded, lambda w, _: w.clock.advance(6))
    assert isinstance(answer, Stored) and not answer.replayed and len(ran) == 2
    [renewed] = crowded.leases.extended
    assert renewed.expires_at == crowded.clock() + 10
    await crowded.close()


async def test_a_request_whose_lease_expired_while_it_queued_takes_it_anew() -> None:
    crowded = World(per_principal=1, ttl=10, failpoints=LOCKED_PATH)
    answer, ran = await _queued_behind_another(crowded, lambda w, _: w.clock.advance(11))
    assert isinstance(answer, Stored) and not answer.replayed and len(ran) == 2
    assert crowded.leases.extended == [] and len(crowded.leases.acquired) == 3
    await crowded.close()


async def test_a_request_whose_expired_lease_a_duplicate_took_while_it_queued_is_409() -> None:
    crowded = World(per_principal=1, ttl=10, failpoints=LOCKED_PATH)

    def duplicate_takes_it(world: World, name: str) -> None:
        world.clock.advance(11)
        world.leases.hold(name)

    answer, ran = await _queued_behind_another(crowded, duplicate_takes_it)
    refused = problem(answer)
    assert (refused.slug, status_of(refused)) == ("operation-in-progress", 409)
    assert len(ran) == 1  # the second never ran
    assert crowded.store.row(crowded.scope(local_route(), "second")) is None
    # the duplicate's lease is left alone: the refused request releases nothing
    assert [lease.token for lease in crowded.leases.held.values()] == ["another"]
    first = crowded.scope(local_route(), "first").lease_name()
    assert [lease.key for lease, _ in crowded.leases.released] == [first]
    await crowded.close()


async def test_a_request_that_queued_while_redis_went_away_is_503() -> None:
    crowded = World(per_principal=1, ttl=10, failpoints=LOCKED_PATH)

    def redis_goes(world: World, name: str) -> None:
        world.clock.advance(6)
        world.leases.unavailable = True

    answer, ran = await _queued_behind_another(crowded, redis_goes)
    refused = problem(answer)
    assert (refused.slug, status_of(refused)) == ("lease-unavailable", 503)
    assert len(ran) == 1
    await crowded.close()


async def test_an_unknown_api_key_identifies_nobody(world: World) -> None:
    assert await world.requests.identify("sk_test_unknown", LOCAL, KEY) is None


async def test_a_row_that_appeared_after_the_first_read_is_answered_by_the_claim(
    world: World,
) -> None:
    """The first read found no row; by the claim the operation had completed elsewhere."""
    record = world.existing(LOCAL, "completed")
    answer = await world.requests.handle(
        LOCAL, world.principal, Seen(key=KEY, record=None), Transfer(amount=5)
    )
    assert isinstance(answer, Stored) and answer.replayed
    assert answer.operation_id == record.reservation.operation_id
    assert world.store.committed == [] and world.leases.held == {}
