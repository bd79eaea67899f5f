"""The one statement of a new operation as a function taking the tenant first
(``SETTLEMENT_DB_CLAIM_SETTLE=function``, service/store/hot_functions.py): servers opening
together create each effect's function once, and a request then sends the call instead of
the statement, writing what the statement writes (tests/integration/test_hot_path.py runs the
one statement's tests both ways)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from service.app.routes import ROUTES
from service.config import Settings
from service.domain.principals import Role
from service.store.hot_functions import (
    INSTALL_LOCK,
    PREFIX,
    TAKE_INSTALL_LOCK,
    FunctionsNotInstalled,
    hot_function,
    install,
)
from service.store.hot_sql import NO_EFFECT
from service.store.migrate import upgrade
from service.store.pool import make_pool, plain_dsn
from service.store.principals import PrincipalStore
from tests.conftest import Services, create_database
from tests.integration.asgi import Asgi
from tests.integration.test_key_tenants import open_accounts, posted

pytestmark = pytest.mark.integration

# a bound of the waits on observable state below: generous
PATIENCE = 20.0
EFFECTS = [spec.effect_sql for spec in ROUTES if spec.effect_sql is not None]


async def test_servers_opening_together_create_each_function_once_the_tenant_first(
    services: Services,
) -> None:
    url = await create_database(services, "functions")
    await asyncio.to_thread(upgrade, url)
    conns = [await asyncpg.connect(plain_dsn(url)) for _ in range(3)]
    try:
        made = await asyncio.gather(*(install(conn, [*EFFECTS, NO_EFFECT]) for conn in conns))
        expected = sorted(hot_function(effect).name for effect in [*EFFECTS, NO_EFFECT])
        assert sorted(name for names in made for name in names) == expected
        assert await install(conns[0], [*EFFECTS, NO_EFFECT]) == []  # nothing missing
        rows = await conns[0].fetch(
            "SELECT proname, proargnames[1] AS first, format_type(proargtypes[0], NULL) AS type,"
            " provolatile::text AS provolatile FROM pg_proc"
            " WHERE starts_with(proname, $1) ORDER BY proname",
            PREFIX,
        )
        assert [row["proname"] for row in rows] == expected
        assert {(row["first"], row["type"], row["provolatile"]) for row in rows} == {
            ("p_tenant", "character varying", "v")
        }
    finally:
        for conn in conns:
            await conn.close()


async def test_a_server_waits_for_anothers_install_beyond_its_lock_timeout(
    services: Services,
) -> None:
    """Installing on Citus distributes each function to every node: a server opening
    meanwhile waits for the install lock longer than a statement's lock timeout."""
    url = await create_database(services, "functions")
    await asyncio.to_thread(upgrade, url)
    pool = await make_pool(Settings.from_env({}, db_lock_timeout=0.05), url, size=1)
    holder = await asyncpg.connect(plain_dsn(url))
    try:
        await holder.execute("BEGIN")
        await holder.execute(TAKE_INSTALL_LOCK, INSTALL_LOCK)

        async def installing() -> list[str]:
            async with pool.acquire() as conn:
                return await install(conn, EFFECTS)

        waiting = asyncio.create_task(installing())
        deadline = time.monotonic() + PATIENCE
        while not await holder.fetchval(
            "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ):  # the install is waiting for the lock
            assert time.monotonic() < deadline, "the install never asked for the lock"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # six times the lock timeout: a statement would have failed
        assert not waiting.done()
        await holder.execute("COMMIT")
        assert len(await waiting) == len(EFFECTS)
    finally:
        await holder.close()
        await pool.close()


async def test_a_role_that_may_not_create_functions_is_told_what_to_do(
    services: Services,
) -> None:
    url = await create_database(services, "functions")
    await asyncio.to_thread(upgrade, url)
    owner = await asyncpg.connect(plain_dsn(url))
    role = f"reader_{uuid.uuid4().hex[:8]}"
    try:
        await owner.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'limited'")
        await owner.execute(f"REVOKE CREATE ON SCHEMA public FROM {role}, PUBLIC")
        limited = await asyncpg.connect(plain_dsn(url), user=role, password="limited")
        try:
            with pytest.raises(FunctionsNotInstalled, match="may not create the functions"):
                await install(limited, EFFECTS)
        finally:
            await limited.close()
        assert not await owner.fetchval(
            "SELECT count(*) > 0 FROM pg_proc WHERE starts_with(proname, $1)", PREFIX
        )
    finally:
        await owner.close()


@pytest.fixture
async def function_app(services: Services, migrated_url: str) -> AsyncIterator[Asgi]:
    """The application in function mode: it creates the functions it lacks as it starts."""
    from service.http.app import create_app

    settings = Settings.from_env(
        {},
        database_url=migrated_url,
        redis_url=services.redis_url,
        sweep_interval=3600.0,
        db_claim_settle="function",
    )
    driven = Asgi(create_app(settings))
    await driven.start()
    yield driven
    await driven.stop()


async def test_a_new_operation_sends_its_effects_function_and_replays_as_before(
    function_app: Asgi, engine: Any
) -> None:
    tenant = "functions-tenant"
    _, key = await PrincipalStore(engine).create(tenant, "client", Role.CLIENT)

    async def post(path: str, body: dict[str, Any], idem: str) -> tuple[int, Any, list[str]]:
        return await posted(function_app, key, path, body, idem)

    opened, said = await open_accounts(function_app, key, (100, 0))
    assert [statements[-2:] for statements in said] == [
        ["hot_sql.IDENTIFY", "hot_function(open-account)"]
    ] * 2
    transfer = {"source": opened[0], "destination": opened[1], "amount": 120, "currency": "EUR"}
    status, refused, statements = await post("/v1/transfers", transfer, "too-much")
    assert status == 402, refused  # the guard's refusal, settled through the no-effect's
    assert statements == [
        "hot_sql.IDENTIFY",
        "hot_function(transfer)",
        "hot_function(no-effect)",
    ]
    transfer["amount"] = 10
    status, made, statements = await post("/v1/transfers", transfer, "transfer")
    assert status == 201, made
    assert statements == ["hot_sql.IDENTIFY", "hot_function(transfer)"]
    status, replayed, statements = await post("/v1/transfers", transfer, "transfer")
    assert (status, replayed) == (201, made)
    assert statements == ["hot_sql.IDENTIFY"]
    async with engine.connect() as conn:
        from sqlalchemy import text

        balances = (
            await conn.execute(
                text("SELECT balance FROM accounts WHERE tenant = :t ORDER BY balance DESC"),
                {"t": tenant},
            )
        ).scalars()
        assert list(balances) == [90, 10]


async def test_a_function_dropped_while_serving_gives_way_to_its_statement(
    function_app: Asgi, engine: Any, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A function dropped after the server created it (by hand, or by a cleanup of another
    version's): new operations send the statement it wraps, and the server says so once."""
    from service.domain.ledger import OPEN_ACCOUNT

    owner = await asyncpg.connect(plain_dsn(migrated_url))
    dropped = hot_function(OPEN_ACCOUNT)
    try:
        _, key = await PrincipalStore(engine).create("dropped-tenant", "client", Role.CLIENT)
        body = {"currency": "EUR", "opening_balance": 5}
        # the call prepared on the connection first, as a server that has served has it
        status, _, said = await posted(function_app, key, "/v1/accounts", body, "before")
        assert (status, said[-1]) == (201, "hot_function(open-account)")
        await owner.execute(f"DROP FUNCTION {dropped.name}")
        with caplog.at_level("ERROR", logger="settlement.store"):
            answers = [
                await posted(function_app, key, "/v1/accounts", body, f"open-{n}") for n in range(2)
            ]
        sent_instead = ["hot_function(open-account)", "claim_settle_with(open-account)"]
        assert [(status, made["balance"], said[-2:]) for status, made, said in answers] == [
            (201, 5, sent_instead)
        ] * 2
        missing = [r for r in caplog.records if "function is missing" in r.getMessage()]
        assert [r.__dict__["function"] for r in missing] == [dropped.name]  # said once
        assert (
            await owner.fetchval("SELECT count(*) FROM accounts WHERE tenant = 'dropped-tenant'")
            == 3
        )
    finally:
        await install(owner, [OPEN_ACCOUNT])  # as it was, for the tests after this one
        await owner.close()
