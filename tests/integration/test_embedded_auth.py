"""The embedded servers let in only clients that hold their password, which only we can read."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import psutil
import pytest
import redis

from devstack import EmbeddedPostgres, EmbeddedRedis

pytestmark = pytest.mark.integration

# What initdb --auth=trust wrote, which every earlier embedded cluster still has.
TRUSTING_HBA = """\
local   all             all                                     trust
host    all             all             127.0.0.1/32            trust
host    all             all             ::1/128                 trust
"""


def _connect(postgres: EmbeddedPostgres, password: str | None) -> None:
    """Connect over TCP as the superuser and run one query; raises when refused."""

    async def run() -> None:
        conn = await asyncpg.connect(
            host="127.0.0.1",
            port=postgres.port,
            user="postgres",
            password=password,
            database="settlement",
        )
        try:
            assert await conn.fetchval("SELECT count(*) FROM kept") == 1
        finally:
            await conn.close()

    asyncio.run(run())


def _password(postgres: EmbeddedPostgres) -> str:
    password = urlsplit(postgres.url).password
    assert password
    return password


def _assert_private(path: Path, owner: int) -> None:
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == owner


def _cluster_owner() -> int:
    """Who owns the password file: we do (as root too: the cluster's user never reads it;
    initdb gets a copy of its own)."""
    return os.geteuid()


def _on_any_command_line(secret: str) -> list[str]:
    found = []
    for proc in psutil.process_iter():
        try:
            if any(secret in arg for arg in proc.cmdline()):
                found.append(proc.name())
        except psutil.Error:
            continue
    return found


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A started cluster holding one row in table ``kept``."""
    server = EmbeddedPostgres(tmp_path, durable=False)
    server.start()
    try:
        _connect_and_run(server, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (1)")
        yield server
    finally:
        server.stop()


def _connect_and_run(postgres: EmbeddedPostgres, sql: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(postgres.url.replace("+asyncpg", ""))
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


def test_postgres_refuses_the_superuser_without_its_password(
    postgres: EmbeddedPostgres,
) -> None:
    for password in (None, "", "wrong"):
        with pytest.raises(asyncpg.InvalidPasswordError):
            _connect(postgres, password)
    _connect(postgres, _password(postgres))


def test_postgres_password_is_in_a_file_only_the_cluster_owner_reads(
    postgres: EmbeddedPostgres,
) -> None:
    password = _password(postgres)
    assert postgres.password_file.read_text() == password + "\n"
    _assert_private(postgres.password_file, _cluster_owner())
    assert password not in postgres.log_path.read_text()
    assert _on_any_command_line(password) == []


def test_a_cluster_that_trusted_everyone_asks_for_a_new_password_and_keeps_its_data(
    postgres: EmbeddedPostgres,
) -> None:
    old_password = _password(postgres)
    postgres.stop()
    # What a cluster made before passwords looks like: no password file, trust for all.
    postgres.password_file.unlink()
    (postgres.pgdata / "pg_hba.conf").write_text(TRUSTING_HBA)

    postgres.start()

    new_password = _password(postgres)
    assert new_password != old_password
    _assert_private(postgres.password_file, _cluster_owner())
    for password in (None, old_password):
        with pytest.raises(asyncpg.InvalidPasswordError):
            _connect(postgres, password)
    _connect(postgres, new_password)  # the row made before is still there
    assert "trust" not in (postgres.pgdata / "pg_hba.conf").read_text()
    assert new_password not in postgres.log_path.read_text()


def test_a_password_file_others_could_read_is_replaced(postgres: EmbeddedPostgres) -> None:
    old_password = _password(postgres)
    postgres.stop()
    postgres.password_file.chmod(0o644)

    postgres.start()

    assert _password(postgres) != old_password
    _assert_private(postgres.password_file, _cluster_owner())
    with pytest.raises(asyncpg.InvalidPasswordError):
        _connect(postgres, old_password)
    _connect(postgres, _password(postgres))


def test_redis_refuses_clients_without_its_password(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path)
    url = server.start()
    try:
        password = urlsplit(url).password
        assert password
        for wrong in (None, "wrong"):
            client = redis.Redis(host="127.0.0.1", port=server.port, password=wrong)
            try:
                with pytest.raises(redis.AuthenticationError):
                    client.ping()
            finally:
                client.close()
        client = redis.Redis.from_url(url)
        try:
            assert client.ping() is True
        finally:
            client.close()
        _assert_private(server.config_file, os.geteuid())
        assert _on_any_command_line(password) == []
        assert password not in server.log_path.read_text()
    finally:
        server.stop()
