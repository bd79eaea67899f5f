"""The fill of ``make bench-scale`` (``bench.scale_fill``) at a tiny size, on a database
migrated to head: its rows are those a settled transfer leaves, so the server replays and
reads them and the retention purge takes them. A schema change the fill does not follow
fails here, not in a long benchmark run."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from bench import fixtures
from bench.scale_fill import Owner, fill
from bench.scale_plans import explain_all
from bench.stack import plain_url
from service.config import Settings
from service.domain.ledger import TransferRequest
from service.evidence import fingerprint, result_digest
from service.store.db import async_url
from service.store.migrate import upgrade
from service.store.retention import Retention, RetentionStore
from tests.conftest import Services, create_database
from tests.integration.asgi import Asgi

pytestmark = pytest.mark.integration

ROWS = 2000
RETENTION = 86_400.0
# enough failed operations that the bench client owns some at this size
FAILED_SHARE = 0.25


async def test_filled_transfers_are_replayed_read_and_purged_as_the_servers_own(
    services: Services,
) -> None:
    url = await create_database(services, "scale_fill")
    await asyncio.to_thread(upgrade, url)
    plain = plain_url(url)  # asyncpg's own form of the URL
    fixture = await fixtures.create(plain)
    owner = Owner(
        fixtures.TENANT,
        uuid.UUID(fixture.principal_id),
        [fixtures.pair(p) for p in range(1, fixtures.PAIRS + 1)],
    )
    now = datetime.now(UTC)
    conn = await asyncpg.connect(plain, timeout=10, command_timeout=60)
    try:
        filled = await fill(
            conn,
            ROWS,
            owners=[owner],
            now=now,
            retention=RETENTION,
            failed_share=FAILED_SHARE,
            chunk=700,
        )
        assert (filled.operations, filled.chunks) == (ROWS, 3)
        counts = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM operations) AS operations,"
            " (SELECT count(*) FROM attempts) AS attempts,"
            " (SELECT count(*) FROM observations) AS observations,"
            " (SELECT count(*) FROM transfers) AS transfers,"
            " (SELECT count(*) FROM operations WHERE state = 'completed') AS completed,"
            " (SELECT count(*) FROM operations WHERE expires_at <= now()) AS expired,"
            " (SELECT count(DISTINCT principal_id) FROM operations) AS principals"
        )
        assert counts is not None
        assert counts["operations"] == counts["attempts"] == counts["observations"] == ROWS
        assert counts["transfers"] == counts["completed"]
        assert counts["expired"] == 0
        assert counts["principals"] > 1
        owned = {
            state: await conn.fetchrow(
                "SELECT o.*, t.source_id, t.destination_id, t.amount AS moved FROM operations o"
                " LEFT JOIN transfers t ON t.operation_id = o.id"
                " WHERE o.principal_id = $1 AND o.state = $2 ORDER BY o.created_at LIMIT 1",
                owner.principal_id,
                state,
            )
            for state in ("completed", "failed")
        }
    finally:
        await conn.close()

    completed, failed = owned["completed"], owned["failed"]
    assert completed is not None and failed is not None
    for row in (completed, failed):
        assert row["result_digest"] == result_digest(
            row["result_status"], row["result_content_type"], row["result_body"]
        )
    request = TransferRequest(
        source=completed["source_id"],
        destination=completed["destination_id"],
        amount=completed["moved"],
        currency=fixtures.CURRENCY,
    )
    assert completed["request_fingerprint"] == fingerprint(fixtures.ROUTE, {}, request)

    from service.http.app import create_app

    settings = Settings.from_env(
        {}, database_url=url, redis_url=services.redis_url, sweep_interval=3600.0
    )
    app = Asgi(create_app(settings))
    await app.start()
    try:
        auth = {"authorization": f"Bearer {fixture.api_key}"}
        body = json.dumps(
            {
                "source": str(completed["source_id"]),
                "destination": str(completed["destination_id"]),
                "amount": completed["moved"],
                "currency": fixtures.CURRENCY,
            }
        ).encode()
        status, headers, answer = await app.request(
            "POST",
            fixtures.TRANSFERS,
            {
                **auth,
                "idempotency-key": completed["idempotency_key"],
                "content-type": "application/json",
            },
            body,
        )
        assert (status, answer) == (201, completed["result_body"])
        assert (b"idempotent-replayed", b"true") in headers

        status, _, answer = await app.request("GET", f"/v1/operations/{failed['id']}", auth)
        assert status == 200
        read = json.loads(answer)
        assert (read["state"], read["key"]) == ("failed", failed["idempotency_key"])
        assert read["result"]["digest"] == failed["result_digest"]
        assert [a["outcome"] for a in read["attempts"]] == ["failed"]
        assert [o["reason"] for o in read["observations"]] == ["terminal-applied"]
        # make bench-scale's plans: the server's statements with their parameters as it sends
        # them (a statement whose parameters changed fails here, not in a long run)
        conn = await asyncpg.connect(plain, timeout=10, command_timeout=60)
        try:
            plans = await explain_all(
                conn,
                key_hash=bytes.fromhex(fixture.key_hash),
                owner=owner.principal_id,
                tenant=fixtures.TENANT,
                purge_now=now + timedelta(seconds=2 * RETENTION),
            )
        finally:
            await conn.close()
        assert all(plan["execution_ms"] is not None for plan in plans.values()), plans
        assert len(plans) == 7
    finally:
        await app.stop()

    # a purge 0.2 x the retention ahead takes the rows that expire within that time
    engine = create_async_engine(async_url(url), pool_size=1)
    try:
        store = RetentionStore(engine, Retention(default=RETENTION, tombstone=RETENTION))
        ahead = now + timedelta(seconds=0.2 * RETENTION)
        page = await store.purge(ROWS, ahead)
    finally:
        await engine.dispose()
    conn = await asyncpg.connect(plain, timeout=10, command_timeout=60)
    try:
        left = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM operations) AS operations,"
            " (SELECT count(*) FROM attempts) AS attempts,"
            " (SELECT count(*) FROM observations) AS observations,"
            " (SELECT count(*) FROM tombstones) AS tombstones"
        )
    finally:
        await conn.close()
    assert left is not None
    assert 0 < page.purged < ROWS
    assert left["tombstones"] == page.purged
    assert left["operations"] == left["attempts"] == left["observations"] == ROWS - page.purged
