"""``settlement config --role-sql ROLE``: the settings every connection sends when it opens,
as ALTER ROLE statements. A connection of that role that sends none of them (as Citus's
connections to its workers do) runs with the same values."""

from __future__ import annotations

import uuid

import asyncpg
from sqlalchemy.engine import make_url

from service.config import Settings
from service.store.db import role_settings_sql, server_settings
from service.store.pool import plain_dsn

PASSWORD = uuid.uuid4().hex


async def test_a_role_given_the_statements_runs_with_every_connection_setting(
    migrated_url: str,
) -> None:
    settings = Settings.from_env(
        {}, database_url=migrated_url, db_lock_timeout=2.5, db_plan_cache_mode="auto"
    )
    wanted = {k: v for k, v in server_settings(settings).items() if k != "application_name"}
    role = f'app "{uuid.uuid4().hex[:8]}'  # a quote in the name: it is quoted
    quoted = '"' + role.replace('"', '""') + '"'
    admin = await asyncpg.connect(plain_dsn(migrated_url))
    try:
        await admin.execute(f"CREATE ROLE {quoted} LOGIN PASSWORD '{PASSWORD}'")
        for statement in role_settings_sql(settings, role):
            await admin.execute(statement)
        with_startup = await asyncpg.connect(plain_dsn(migrated_url), server_settings=wanted)
        as_role = await asyncpg.connect(
            plain_dsn(
                make_url(migrated_url)
                .set(username=role, password=PASSWORD)
                .render_as_string(hide_password=False)
            )
        )
        try:
            for name in wanted:
                expected = await with_startup.fetchval("SELECT current_setting($1)", name)
                got = await as_role.fetchval("SELECT current_setting($1)", name)
                assert got == expected, name
            assert await as_role.fetchval("SHOW lock_timeout") == "2500ms"
            assert await as_role.fetchval("SHOW plan_cache_mode") == "auto"
        finally:
            await with_startup.close()
            await as_role.close()
    finally:
        await admin.execute(f"DROP OWNED BY {quoted}")
        await admin.execute(f"DROP ROLE {quoted}")
        await admin.close()


def test_the_statements_quote_the_role_and_name_every_setting_but_the_connections_own() -> None:
    settings = Settings.from_env({})
    lines = role_settings_sql(settings, 'a"b')
    names = {line.split(" SET ")[1].split(" = ")[0] for line in lines}
    assert names == set(server_settings(settings)) - {"application_name"}
    assert all(line.startswith('ALTER ROLE "a""b" SET ') for line in lines)
