"""Refused evidence is kept with the observer that sent it, never under another tenant's
operation; one observer's quarantined evidence is capped; the orphans go after their
retention. Real PostgreSQL, the intake called as the route calls it."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime

import msgspec
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service.app.answers import Problem
from service.app.evidence import EvidenceIntake
from service.domain.principals import Principal, Role
from service.evidence import (
    Evidence,
    EvidenceResult,
    SignedEvidence,
    canonical,
    content_type_for,
    result_digest,
    sign,
)
from service.store.db import async_url
from service.store.migrate import upgrade
from service.store.retention import _FORGET_ORPHANS, Retention, RetentionStore
from service.store.rows import at
from service.store.settlement import SettlementStore
from service.store.settlement_reads import _QUARANTINED
from service.store.tables import observations
from tests.conftest import Services, create_database
from tests.integration.factories import Clock, count, new_operation
from tests.integration.test_feed_retention import plan

pytestmark = pytest.mark.integration

SECRET = "provider-secret-for-these-tests"
ROUTE = "POST /v1/transfers"  # the factories' operations: taken as an external effect here
LIMIT = 3
WINDOW = 60.0


def _observer(tenant: str) -> Principal:
    return Principal(
        id=uuid.uuid4(), tenant=tenant, name="obs", role=Role.OBSERVER, credential_generation=1
    )


def _evidence(operation_id: uuid.UUID, *, signed: bool) -> SignedEvidence:
    body = {"id": str(operation_id)}
    evidence = Evidence(
        operation_id=operation_id,
        binding_generation=1,
        request_fingerprint="a" * 64,
        outcome="completed",
        result=EvidenceResult(status=201, body=body),
        result_digest=result_digest(201, content_type_for("completed"), canonical(body)),
        issued_at=datetime.now(UTC).isoformat(),
    )
    return SignedEvidence(evidence, sign(evidence, SECRET) if signed else "0" * 64)


def _intake(store: SettlementStore, clock: Clock) -> EvidenceIntake:
    return EvidenceIntake(
        store,
        secret=SECRET,
        external_routes=frozenset({ROUTE}),
        quarantine_limit=LIMIT,
        quarantine_window=WINDOW,
        clock=clock,
    )


def _slug(answer: object) -> str:
    assert isinstance(answer, Problem), answer
    return answer.slug


async def test_another_tenants_operation_gets_nothing_and_the_sender_keeps_it(
    engine: AsyncEngine, store: SettlementStore
) -> None:
    clock = Clock(time.time())
    _, victim = await new_operation(engine, store, clock)  # tenant acme's
    intake = _intake(store, clock)
    listed = await count(engine, observations, observations.c.operation_id == victim)
    stranger = _observer("elsewhere")

    assert _slug(await intake.deliver(stranger, _evidence(victim, signed=False))) == (
        "invalid-evidence"
    )
    assert _slug(await intake.deliver(stranger, _evidence(victim, signed=True))) == "not-found"

    assert await count(engine, observations, observations.c.operation_id == victim) == listed
    sent = observations.c.detail["principal_id"].astext == str(stranger.id)
    assert await count(engine, observations, sent, observations.c.operation_id.is_(None)) == 2
    assert await count(engine, observations, sent) == 2
    # the tenant's own observer's unsigned evidence is listed under its operation
    own = _observer("acme")
    assert _slug(await intake.deliver(own, _evidence(victim, signed=False))) == ("invalid-evidence")
    mine = observations.c.detail["principal_id"].astext == str(own.id)
    assert await count(engine, observations, mine, observations.c.operation_id == victim) == 1


async def test_an_observer_past_its_limit_is_refused_until_the_window_passes(
    engine: AsyncEngine, store: SettlementStore
) -> None:
    clock = Clock(time.time())
    intake = _intake(store, clock)
    noisy, quiet = _observer("acme"), _observer("acme")
    for _ in range(LIMIT):
        assert _slug(await intake.deliver(noisy, _evidence(uuid.uuid4(), signed=True))) == (
            "not-found"
        )
    refused = await intake.deliver(noisy, _evidence(uuid.uuid4(), signed=True))
    assert isinstance(refused, Problem) and refused.slug == "evidence-quota-exceeded"
    assert refused.retry_after and refused.retry_after_seconds is not None
    assert WINDOW - 30 < refused.retry_after_seconds <= WINDOW
    sent = observations.c.detail["principal_id"].astext == str(noisy.id)
    assert await count(engine, observations, sent) == LIMIT  # the refusal recorded nothing
    # another observer is not held back by this one
    assert _slug(await intake.deliver(quiet, _evidence(uuid.uuid4(), signed=False))) == (
        "invalid-evidence"
    )
    # once its oldest left the window, it is heard again
    clock.advance(WINDOW + 1)
    assert _slug(await intake.deliver(noisy, _evidence(uuid.uuid4(), signed=True))) == ("not-found")


async def test_the_count_reads_through_its_index_and_the_orphans_go(
    engine: AsyncEngine, store: SettlementStore
) -> None:
    clock = Clock(time.time())
    stranger = _observer("elsewhere")
    _, victim = await new_operation(engine, store, clock)
    assert _slug(await _intake(store, clock).deliver(stranger, _evidence(victim, signed=True))) == (
        "not-found"
    )
    async with engine.begin() as conn:
        params = {"principal": str(stranger.id), "since": at(clock() - WINDOW), "limit": LIMIT}
        assert "ix_observations_quarantined_evidence_by_principal" in await plan(
            conn, _QUARANTINED, params
        )
        assert "ix_observations_unknown_operation_created_at" in await plan(
            conn, _FORGET_ORPHANS, {"cutoff": at(clock()), "batch": 10}
        )
        # aged past the orphans' retention
        await conn.execute(
            text(
                "UPDATE observations SET created_at = created_at - interval '2 days'"
                " WHERE detail ->> 'principal_id' = :p"
            ),
            {"p": str(stranger.id)},
        )
    retention = Retention(default=60.0, tombstone=600.0, orphans=86_400.0)
    while (await RetentionStore(engine, retention).forget_orphans(100, at(clock()))).full:
        pass
    sent = observations.c.detail["principal_id"].astext == str(stranger.id)
    assert await count(engine, observations, sent) == 0
    assert msgspec.structs.asdict(
        await store.reads.quarantined_evidence(stranger.id, at(0), 5)
    ) == {
        "count": 0,
        "oldest": None,
    }


async def test_migration_0015_takes_refused_evidence_out_of_the_histories_it_was_written_into(
    services: Services,
) -> None:
    """Rows the intake wrote before: another tenant's observer's, and evidence about an
    unknown operation, leave the operation they named; the owner's own stay."""
    url = await create_database(services, "untie")
    await asyncio.to_thread(upgrade, url, "0014")
    engine = create_async_engine(async_url(url))
    victim, ghost = uuid.uuid4(), uuid.uuid4()
    try:
        async with engine.begin() as conn:
            for tenant, name in (("b", "owner"), ("b", "own-observer"), ("a", "stranger")):
                await conn.execute(
                    text(
                        "INSERT INTO principals (id, tenant, name, role, key_hash)"
                        " VALUES (:id, :tenant, :name, 'observer', :hash)"
                    ),
                    {"id": _ids[name], "tenant": tenant, "name": name, "hash": _ids[name].bytes},
                )
            await conn.execute(
                text(
                    "INSERT INTO operations (id, tenant, principal_id, route, idempotency_key,"
                    " state, binding_generation, request_fingerprint, bound_principal_id,"
                    " bound_credential_generation, revision, fencing_token)"
                    " VALUES (:id, 'b', :owner, :route, 'k', 'unknown', 1, :fp, :owner, 1, 2, 1)"
                ),
                {"id": victim, "owner": _ids["owner"], "route": ROUTE, "fp": "a" * 64},
            )
            for operation_id, reason, sender in (
                (victim, "unverified-evidence", "stranger"),
                (victim, "unknown-operation", "stranger"),
                (ghost, "unknown-operation", "stranger"),
                (victim, "unverified-evidence", "own-observer"),
            ):
                await conn.execute(
                    text(
                        "INSERT INTO observations (operation_id, source, kind, verified, stage,"
                        " disposition, reason, detail) VALUES (:op, 'evidence', 'completed',"
                        " false, 'A', 'quarantined', :reason, CAST(:detail AS jsonb))"
                    ),
                    {
                        "op": operation_id,
                        "reason": reason,
                        "detail": f'{{"principal_id": "{_ids[sender]}"}}',
                    },
                )
        await asyncio.to_thread(upgrade, url)
        async with engine.connect() as conn:
            left = (
                await conn.execute(
                    text(
                        "SELECT operation_id, reason, detail ->> 'principal_id' AS sender"
                        " FROM observations ORDER BY id"
                    )
                )
            ).all()
    finally:
        await engine.dispose()
    stranger, own = str(_ids["stranger"]), str(_ids["own-observer"])
    assert [tuple(row) for row in left] == [
        (None, "unknown-operation", stranger),
        (None, "unknown-operation", stranger),
        (None, "unknown-operation", stranger),
        (victim, "unverified-evidence", own),
    ]


_ids = {name: uuid.uuid4() for name in ("owner", "own-observer", "stranger")}
